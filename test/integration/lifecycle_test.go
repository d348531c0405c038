package integration

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestLeaseLifecycleSequence plays one resource's life through the real API server:
// renewal, expiry at equality, fencing, a third acquirer kept out,
// same-owner re-acquisition and late release/renew of an earlier grant.
func TestLeaseLifecycleSequence(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b, c := as(t, "seed-a"), as(t, "seed-b"), as(t, "seed-c")
	const obj = "settlement"

	tl.at(0)
	ga := mustAcquire(t, a, ns, 5)
	if ga.Status.FenceToken != 1 || !ga.Status.ExpiresAt.Time.Equal(tl.t(5)) {
		t.Fatalf("A's grant = fence %d until %v, want fence 1 until t=5", ga.Status.FenceToken, ga.Status.ExpiresAt)
	}
	tl.at(2)
	if err := write(t, a, ns, obj, ga, "1", "a-1"); err != nil {
		t.Fatalf("A's write at t=2: %v", err)
	}
	tl.at(4)
	if err := renew(t, a, ga); err != nil {
		t.Fatalf("A's renew at t=4: %v", err)
	}
	ga = waitFor(t, ga, "renewed to t=9", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.ObservedRenewals == 1 && g.Status.ExpiresAt.Time.Equal(tl.t(9))
	})
	if ga.Status.FenceToken != 1 {
		t.Fatalf("renew changed the fence to %d", ga.Status.FenceToken)
	}
	tl.at(8)
	if err := write(t, a, ns, obj, ga, "1", "a-2"); err != nil {
		t.Fatalf("A's write at t=8: %v", err)
	}

	tl.at(9) // Equality is expired.
	wantReason(t, "A's write at t=9", write(t, a, ns, obj, ga, "1", "forbidden"), "EXPIRED")
	// The renew is judged by the controller's clock: answered EXPIRED in
	// the status, the grant ended.
	if err := renew(t, a, ga); err != nil {
		t.Fatalf("A's renew at t=9: %v, want it answered in the status", err)
	}
	ga = waitPhase(t, ga, lockingv1alpha1.PhaseExpired)
	if c := metaCond(ga, lockingv1alpha1.ConditionRenewed); c == nil || c.Status != metav1.ConditionFalse || c.Reason != lockingv1alpha1.LockGrantReasonExpired {
		t.Fatalf("A's Renewed condition after the renew at t=9 = %+v, want False, Expired", c)
	}

	tl.at(10)
	gb := mustAcquire(t, b, ns, 5)
	if gb.Status.FenceToken != 2 {
		t.Fatalf("B's fence = %d, want 2", gb.Status.FenceToken)
	}
	tl.at(11)
	if err := write(t, b, ns, obj, gb, "2", "b-1"); err != nil {
		t.Fatalf("B's write at t=11: %v", err)
	}
	tl.at(12)
	wantReason(t, "B writing with A's fence", write(t, b, ns, obj, gb, "1", "forbidden"), "STALE_OWNER")
	wantReason(t, "A writing with A's grant", write(t, a, ns, obj, ga, "1", "forbidden"), "STALE_OWNER")
	wantReason(t, "B writing under A's grant", write(t, b, ns, obj, ga, "1", "forbidden"), "NOT_OWNER")

	// A third acquirer is kept out while B holds: it waits in the queue,
	// then withdraws.
	gc, err := acquire(t, c, ns, 5)
	if err != nil {
		t.Fatal(err)
	}
	gc = waitPhase(t, gc, lockingv1alpha1.PhasePending)
	if gc.Status.QueuePosition == nil || *gc.Status.QueuePosition != 0 {
		t.Fatalf("C's queue position = %v, want 0", gc.Status.QueuePosition)
	}
	if err := release(t, c, gc); err != nil {
		t.Fatalf("C withdrawing: %v", err)
	}
	if gc = waitPhase(t, gc, lockingv1alpha1.PhaseReleased); gc.Status.FenceToken != 0 {
		t.Fatalf("a withdrawn request was issued fence %d", gc.Status.FenceToken)
	}

	wantReason(t, "A releasing its expired grant", release(t, a, ga), "EXPIRED")
	if err := release(t, b, gb); err != nil {
		t.Fatalf("B's release at t=12: %v", err)
	}
	waitPhase(t, gb, lockingv1alpha1.PhaseReleased)

	tl.at(13)
	gb2 := mustAcquire(t, b, ns, 5)
	if gb2.Status.FenceToken != 3 {
		t.Fatalf("B's second fence = %d, want 3", gb2.Status.FenceToken)
	}
	wantReason(t, "B releasing its earlier grant", release(t, b, gb), "ALREADY_ENDED")
	wantReason(t, "B renewing its earlier grant", renew(t, b, gb), "ALREADY_ENDED")
	if g := get(t, gb2); g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Spec.Release {
		t.Fatalf("the late release/renew of B's earlier grant touched the new one: %+v", g.Status)
	}
	tl.at(14)
	if err := write(t, b, ns, obj, gb2, "3", "new-b"); err != nil {
		t.Fatalf("B's write with fence 3: %v", err)
	}
	if err := release(t, b, gb2); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gb2, lockingv1alpha1.PhaseReleased)
	gc2 := mustAcquire(t, c, ns, 5)
	if gc2.Status.FenceToken != 4 {
		t.Fatalf("C's fence = %d, want 4", gc2.Status.FenceToken)
	}
	tl.at(15)
	if err := write(t, c, ns, obj, gc2, "4", "c-1"); err != nil {
		t.Fatalf("C's write: %v", err)
	}
	if data, fence := readCM(t, ns, obj); data != "c-1" || fence != "4" {
		t.Fatalf("object = %q at fence %s, want c-1 at 4", data, fence)
	}
	if f := counterOf(t, ns).Spec.Fence; f != 4 {
		t.Fatalf("counter fence = %d, want 4", f)
	}
}
