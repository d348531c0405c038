package integration

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A holder paused past its lease writes late; the write is refused,
// also when it arrives after the successor was granted but before the
// successor wrote anything.
func TestPausePastLease(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, "c01-a"), as(t, "c01-b")
	const obj = "batch"

	tl.at(0)
	ga := mustAcquire(t, a, ns, 10)
	if err := write(t, a, ns, obj, ga, fenceOf(ga), "a-prepared"); err != nil {
		t.Fatal(err)
	}
	// A is frozen for 15 s.
	tl.at(10)
	wake(t, ga)
	waitPhase(t, ga, lockingv1alpha1.PhaseExpired)
	tl.at(12)
	gb := mustAcquire(t, b, ns, 10)
	if gb.Status.FenceToken != 2 {
		t.Fatalf("B's fence = %d, want 2", gb.Status.FenceToken)
	}
	tl.at(12.5) // B holds fence 2 but has not written: maxSeen is still 1.
	wantReason(t, "A's late write before B wrote", write(t, a, ns, obj, ga, "1", "a-late"), "STALE_OWNER")
	tl.at(13)
	if err := write(t, b, ns, obj, gb, "2", "b-result"); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	tl.at(16)
	wantReason(t, "A's late write after B wrote", write(t, a, ns, obj, ga, "1", "a-late"), "STALE_OWNER")
	if data, fence := readCM(t, ns, obj); data != "b-result" || fence != "2" {
		t.Fatalf("object = %q at fence %s, want B's data at fence 2", data, fence)
	}
}

// A waiter whose own wait limit passed is never granted later.
func TestWaiterDeadline(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	g1 := mustAcquire(t, as(t, "c02-p1"), ns, 20)
	tl.at(0.1)
	g2, err := acquire(t, as(t, "c02-p2"), ns, 5, func(g *lockingv1alpha1.LockGrant) { g.Spec.WaitTimeoutSeconds = 5 })
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, g2, lockingv1alpha1.PhasePending)
	tl.at(5.1)
	wake(t, g2)
	waitPhase(t, g2, lockingv1alpha1.PhaseTimedOut)
	tl.at(20)
	wake(t, g1)
	waitPhase(t, g1, lockingv1alpha1.PhaseExpired)
	if g := get(t, g2); g.Status.Phase != lockingv1alpha1.PhaseTimedOut || g.Status.FenceToken != 0 {
		t.Fatalf("P2 after P1 expired = %+v, want still TimedOut with no fence", g.Status)
	}
	tl.at(21)
	if g3 := mustAcquire(t, as(t, "c02-p3"), ns, 5); g3.Status.FenceToken != 2 {
		t.Fatalf("P3's fence = %d, want 2", g3.Status.FenceToken)
	}
}

// A release whose reply was lost, retried after a new acquisition,
// fails and leaves the new grant Held. Releases name one acquisition: a
// retry aimed at a name that now belongs to a newer grant is refused by
// the UID precondition.
func TestLostReleaseReply(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a := as(t, "c03-a")
	tl.at(0)
	g1 := mustAcquire(t, a, ns, 30)
	tl.at(1)
	_ = release(t, a, g1) // The reply is lost: the client does not know.
	waitPhase(t, g1, lockingv1alpha1.PhaseReleased)
	tl.at(2)
	g2 := mustAcquire(t, a, ns, 30)
	if g2.Status.FenceToken != 2 {
		t.Fatalf("g2's fence = %d, want 2", g2.Status.FenceToken)
	}
	tl.at(3)
	wantReason(t, "retried release of g1", release(t, a, g1), "ALREADY_ENDED")
	wake(t, g2)
	if g := get(t, g2); g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.FenceToken != 2 || g.Spec.Release {
		t.Fatalf("g2 after the retry = %+v, want Held with fence 2", g.Status)
	}

	// The same name reused by a later acquisition: a release carrying the
	// earlier UID cannot reach it.
	if err := admin.Delete(t.Context(), g1); err != nil {
		t.Fatal(err)
	}
	reused, err := acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) { g.GenerateName, g.Name = "", g1.Name })
	if err != nil {
		t.Fatal(err)
	}
	// The API server refuses a patch whose metadata.uid differs from the
	// stored object's (422 "field is immutable").
	if err := release(t, a, g1); !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) {
		t.Fatalf("release with g1's UID on the reused name: %v, want it refused by the UID precondition", err)
	}
	if g := get(t, reused); g.Spec.Release {
		t.Fatal("the release aimed at g1 released the later grant of the same name")
	}
}

// The same owner re-acquires and gets a new fence; a write left over
// from the first term is refused, after a release and after an expiry.
func TestSameOwnerReacquires(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a := as(t, "c07-a")
	const obj = "report"
	tl.at(0)
	g1 := mustAcquire(t, a, ns, 5)
	if err := write(t, a, ns, obj, g1, fenceOf(g1), "term-1"); err != nil {
		t.Fatal(err)
	}
	if err := release(t, a, g1); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, g1, lockingv1alpha1.PhaseReleased)
	g2 := mustAcquire(t, a, ns, 5)
	if g2.Status.FenceToken != g1.Status.FenceToken+1 {
		t.Fatalf("re-acquired fence %d after %d, want the next one", g2.Status.FenceToken, g1.Status.FenceToken)
	}
	wantReason(t, "old term under the old grant", write(t, a, ns, obj, g1, fenceOf(g1), "stale"), "STALE_OWNER")
	wantReason(t, "old fence under the new grant", write(t, a, ns, obj, g2, fenceOf(g1), "stale"), "STALE_OWNER")
	if err := write(t, a, ns, obj, g2, fenceOf(g2), "term-2"); err != nil {
		t.Fatal(err)
	}

	// Same when the first term expired instead of being released.
	tl.at(5)
	wake(t, g2)
	waitPhase(t, g2, lockingv1alpha1.PhaseExpired)
	g3 := mustAcquire(t, a, ns, 5)
	if g3.Status.FenceToken != g2.Status.FenceToken+1 {
		t.Fatalf("fence after expiry = %d, want %d", g3.Status.FenceToken, g2.Status.FenceToken+1)
	}
	wantReason(t, "expired term", write(t, a, ns, obj, g2, fenceOf(g2), "stale"), "STALE_OWNER")
	if data, _ := readCM(t, ns, obj); data != "term-2" {
		t.Fatalf("object = %q, want term-2", data)
	}
}

// A renew after expiry fails, never silently re-acquires, and the
// lapse is visible on the grant; whether or not someone else took R.
// Admission judges a renew by the grant's state, the controller by its
// clock against the lease the counter records: a renew that arrives
// after the lease end while the grant still shows Held is accepted by the
// API server and answered EXPIRED in the status (Renewed False, the grant
// Expired), never by a new lease.
func TestRenewAfterExpiry(t *testing.T) {
	for _, takenMeanwhile := range []bool{false, true} {
		name := "free"
		if takenMeanwhile {
			name = "taken"
		}
		t.Run(name, func(t *testing.T) {
			ns, tl := namespace(t), startTimeline()
			a := as(t, "c08-a")
			tl.at(0)
			g := mustAcquire(t, a, ns, 2)
			if takenMeanwhile {
				tl.at(3)
				mustAcquire(t, as(t, "c08-b"), ns, 10)
				// The pass that granted B ended A: its renew is refused.
				tl.at(3.5)
				wantReason(t, "renew at t=3.5", renew(t, a, g), "EXPIRED")
				if g = get(t, g); g.Spec.Renewals != 0 || g.Status.Phase != lockingv1alpha1.PhaseExpired {
					t.Fatalf("after the refused renew: renewals %d, phase %s; want 0, Expired", g.Spec.Renewals, g.Status.Phase)
				}
				return
			}
			// The controller's pass at t=3.5 and the renew race: a renew
			// that lands first, while the status still says Held, is
			// accepted by the API server and answered Expired in the
			// status; one that lands after is refused EXPIRED by
			// admission. Either way the lease is not extended.
			tl.at(3.5)
			if err := renew(t, a, g); err != nil && reason(err) != "EXPIRED" {
				t.Fatalf("renew at t=3.5: %v, want it accepted or refused EXPIRED", err)
			}
			g = waitFor(t, g, "ended", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase.Final() })
			if g.Status.Phase != lockingv1alpha1.PhaseExpired || !g.Status.ExpiresAt.Time.Equal(tl.t(2)) {
				t.Fatalf("after the late renew: phase %s until %v, want Expired at t=2", g.Status.Phase, g.Status.ExpiresAt)
			}
			if c := metaCond(g, lockingv1alpha1.ConditionRenewed); g.Status.ObservedRenewals == 1 && (c == nil || c.Status != metav1.ConditionFalse || c.Reason != lockingv1alpha1.LockGrantReasonExpired) {
				t.Fatalf("Renewed condition = %+v, want False, Expired", c)
			}
			if c := metaCond(g, lockingv1alpha1.ConditionReady); c == nil || c.Reason != lockingv1alpha1.LockGrantReasonExpired {
				t.Fatalf("Ready condition = %+v, want the lapse (Expired) visible", c)
			}
			if c := counterOf(t, ns); c.Spec.Holder != nil {
				t.Fatalf("the counter still names %s after the late renew", c.Spec.Holder.Name)
			}
			g2 := mustAcquire(t, a, ns, 2)
			if g2.Status.FenceToken != 2 {
				t.Fatalf("re-acquired fence = %d, want 2", g2.Status.FenceToken)
			}
		})
	}
}

// A release that arrives after the lease end, while the grant still shows
// Held, is accepted by the API server and answered in the status (and one
// that arrives after the controller ended the grant is refused EXPIRED):
// the grant ends Expired, not Released, so its owner learns that what it did
// after the lease end was not protected (pkg/lock's Release returns
// fencing.ErrExpired from that status).
func TestLateReleaseAnsweredInStatus(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a := as(t, "late-release")
	tl.at(0)
	g := mustAcquire(t, a, ns, 2)
	tl.at(2.5)
	// The controller's pass at t=2.5 may end the grant first: then
	// admission refuses the release EXPIRED.
	err := release(t, a, g)
	if err != nil && reason(err) != "EXPIRED" {
		t.Fatalf("late release: %v, want it accepted and answered in the status, or refused EXPIRED", err)
	}
	g = waitFor(t, g, "ended", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase.Final() })
	if g.Status.Phase != lockingv1alpha1.PhaseExpired || g.Spec.Release != (err == nil) {
		t.Fatalf("after the late release (%v): phase %s, release %v; want Expired", err, g.Status.Phase, g.Spec.Release)
	}
	if c := metaCond(g, lockingv1alpha1.ConditionReady); c == nil || c.Reason != lockingv1alpha1.LockGrantReasonExpired {
		t.Fatalf("Ready condition = %+v, want Expired", c)
	}
	wantReason(t, "releasing again", release(t, a, g), "EXPIRED")
}

// A delayed release that lands after expiry fails and the successor
// stays Held; an administrator's forced release (deleting the grant, an
// audited action that needs delete rights) hands the resource on with a
// higher fence.
func TestLateReleaseAfterExpiry(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, "c09-a"), as(t, "c09-b")
	tl.at(0)
	ga := mustAcquire(t, a, ns, 5)
	// A sends a release at t=4.9 that is delayed until t=6.2.
	tl.at(5)
	wake(t, ga)
	waitPhase(t, ga, lockingv1alpha1.PhaseExpired)
	tl.at(6)
	gb := mustAcquire(t, b, ns, 5)
	tl.at(6.2)
	wantReason(t, "A's late release", release(t, a, ga), "EXPIRED")
	wake(t, gb)
	if g := get(t, gb); g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.FenceToken != 2 {
		t.Fatalf("B after A's late release = %+v, want Held with fence 2", g.Status)
	}

	// A waiter queues behind B; the administrator force-releases B.
	gc, err := acquire(t, as(t, "c09-c"), ns, 5)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gc, lockingv1alpha1.PhasePending)
	if err := admin.Delete(t.Context(), gb); err != nil {
		t.Fatal(err)
	}
	if gc = waitPhase(t, gc, lockingv1alpha1.PhaseHeld); gc.Status.FenceToken != 3 {
		t.Fatalf("fence after the forced release = %d, want 3", gc.Status.FenceToken)
	}
}

// Renew by another identity fails NOT_OWNER; a retried renew by the true
// owner succeeds with the same fence (the server side of a renew whose
// reply was lost).
func TestRenewRetrySameFence(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a := as(t, "c10-a")
	tl.at(0)
	g := mustAcquire(t, a, ns, 10)
	tl.at(2)
	if err := renew(t, a, g); err != nil {
		t.Fatal(err)
	}
	// The reply is lost; A retries.
	if err := renew(t, a, g); err != nil {
		t.Fatalf("the owner's retried renew: %v", err)
	}
	g = waitFor(t, g, "renewed twice", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.ObservedRenewals == 2 })
	if g.Status.FenceToken != 1 || g.Status.Phase != lockingv1alpha1.PhaseHeld || !g.Status.ExpiresAt.Time.Equal(tl.t(12)) {
		t.Fatalf("after retried renew: %+v, want Held, fence 1, until t=12", g.Status)
	}
	wantReason(t, "renew by another identity", renew(t, as(t, "c10-b"), g), "NOT_OWNER")
}

func metaCond(g *lockingv1alpha1.LockGrant, typ string) *metav1.Condition {
	for i := range g.Status.Conditions {
		if g.Status.Conditions[i].Type == typ {
			return &g.Status.Conditions[i]
		}
	}
	return nil
}
