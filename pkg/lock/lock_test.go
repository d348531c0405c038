package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// keyOf is the grant a request ID names in ns.
func keyOf(ns, requestID string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.GrantNameForRequest(requestID)}
}

// release releases h and fails the test unless the answer is want: nil
// for "", else an error matching want's sentinel.
func release(t *testing.T, h *lock.Handle, want fencing.Reason) {
	t.Helper()
	err := h.Release(t.Context())
	if want == "" && err != nil || want != "" && (!errors.Is(err, want.Sentinel()) || fencing.ReasonOf(err) != want) {
		t.Fatalf("Release of %s = %v; want %q", h.Info().Grant, err, want)
	}
}

// A holder acquires, writes a guarded object under its fence, releases; a
// write that still carries the old grant is refused.
func TestAcquireStampRelease(t *testing.T) {
	ns := namespace(t)
	c := as(t, "basic-a")
	locks := newTestClient(t, c, lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), "invoice-batch/basic", lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if h.State() != holder.Held || h.Info().Fence != 1 || checkErr(h) != nil {
		t.Fatalf("after Acquire: state %s, fence %d, Check %v; want HELD, 1, nil", h.State(), h.Info().Fence, checkErr(h))
	}
	if want := "system:serviceaccount:billing:basic-a"; h.Info().Owner != want {
		t.Fatalf("owner %q, want %q", h.Info().Owner, want)
	}
	if r := remaining(h); r <= 15*time.Second || r > 27*time.Second {
		t.Fatalf("Check leaves %s, want about TTL - margin (27s)", r)
	}
	g := grantOf(t, h.Info().Grant)
	if g.UID != h.Info().UID || g.Labels[lockingv1alpha1.RequestIDLabel] != h.Info().RequestID || g.Spec.Renewals != 0 {
		t.Fatalf("grant %+v does not match the handle (uid %s, request %s), or was renewed to confirm", g.ObjectMeta, h.Info().UID, h.Info().RequestID)
	}

	// The record comes with the grant's status, which may land a moment
	// after the resource's fence record told the handle it holds.
	if _, err := h.AwaitRecord(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rec := h.Record(); rec == nil || rec.FenceToken != 1 || rec.LeaseID != string(h.Info().UID) || rec.OperationRoot != h.Info().OperationRoot || h.Proof() == "" {
		t.Fatalf("signed grant record %+v, proof %q; want fence 1 of this acquisition and its operation root", rec, h.Proof())
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "result"}, Data: map[string]string{"total": "1"}}
	if err := h.Stamp(cm); err != nil {
		t.Fatal(err)
	}
	if cm.Annotations[lockingv1alpha1.ProofAnnotation] != h.Proof() || cm.Annotations[lockingv1alpha1.FenceAnnotation] != "1" ||
		cm.Annotations[lockingv1alpha1.GrantAnnotation] != ns+"/"+h.Info().Grant.Name || cm.Labels[lockingv1alpha1.GuardedLabel] != "true" {
		t.Fatalf("stamped object: labels %v, annotations %v", cm.Labels, cm.Annotations)
	}
	if err := c.Create(h.Context(), cm); err != nil {
		t.Fatalf("guarded create under the lock: %v", err)
	}
	seg, err := h.NextSegment()
	if err != nil || seg.Seq != 1 || seg.Fence != 1 || seg.GrantUID != h.Info().UID || seg.OperationRoot == "" {
		t.Fatalf("NextSegment = %+v, %v", seg, err)
	}
	if seg, _ := h.NextSegment(); seg.Seq != 2 {
		t.Fatalf("second segment has seq %d, want 2", seg.Seq)
	}
	h.ResumeSegmentsAfter(5)
	h.ResumeSegmentsAfter(3) // never back
	if seg, _ := h.NextSegment(); seg.Seq != 6 || seg.Owner != h.Info().Owner || seg.Fencing([]byte("x")).Digest == "" {
		t.Fatalf("segment after resuming at 5: %+v, want seq 6 of this owner", seg)
	}

	// A resource that refused a write with FENCE_REGRESSION is reported on
	// the grant, where the controller raises the alarm.
	if err := h.ReportFenceRegression(t.Context(), "fence 1 was accepted from another grant"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the FenceRegression condition is raised", func() bool {
		return meta.IsStatusConditionTrue(grantOf(t, h.Info().Grant).Status.Conditions, lockingv1alpha1.ConditionFenceRegression)
	})

	release(t, h, "")
	if !closed(h.Context().Done()) || !errors.Is(context.Cause(h.Context()), lock.ErrReleased) || !errors.Is(context.Cause(h.Context()), lock.ErrReleased) {
		t.Fatalf("after Release: context ended %v, cause %v", closed(h.Context().Done()), context.Cause(h.Context()))
	}
	if h.State() != holder.Released {
		t.Fatalf("state %s, want RELEASED", h.State())
	}
	if err := h.Stamp(&corev1.ConfigMap{}); !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("Stamp after Release: %v, want ErrReleased", err)
	}
	if _, err := h.NextSegment(); !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("NextSegment after Release: %v, want ErrReleased", err)
	}
	cm.Data["total"] = "stale"
	if err := c.Update(t.Context(), cm); lock.Refusal(err) == nil {
		t.Fatalf("a write under the released grant: %v, want a fencing refusal", err)
	}
	release(t, h, fencing.ReasonAlreadyEnded)
}

// The holder's wall clock is 30 s behind the controller's and runs 1.5x
// fast. Whenever the holder believes it may act, the controller's lease is
// live; when renewals stop getting through, the holder stops before the
// controller's expiry, and the successor is granted only after it.
func TestHolderClockSkewAndRate(t *testing.T) {
	ns := namespace(t)
	const res = "ledger/c06"
	hclk := clocktesting.NewFakeClock(clk.Now().Add(-30 * time.Second))
	step := func(d time.Duration) {
		clk.Step(d)
		hclk.Step(d * 3 / 2)
	}
	fa := &faulty{WithWatch: as(t, "c06-a")}
	a, err := newTestClient(t, fa, lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithTTL(10*time.Second), lock.WithClock(hclk))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AwaitRecord(t.Context()); err != nil { // the invariant reads A's status
		t.Fatal(err)
	}
	type result struct {
		h   *lock.Handle
		err error
	}
	bDone := make(chan result, 1)
	go func() {
		h, err := newTestClient(t, as(t, "c06-b"), lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithTTL(10*time.Second), lock.WithRequestID("c06-b"))
		bDone <- result{h, err}
	}()
	keyB := keyOf(ns, "c06-b")
	waitPhase(t, keyB, lockingv1alpha1.PhasePending)

	// invariant: A may act only inside the controller's lease.
	invariant := func() {
		t.Helper()
		g := grantOf(t, a.Info().Grant)
		if checkErr(a) == nil && (g.Status.Phase != lockingv1alpha1.PhaseHeld || !clk.Now().Before(g.Status.ExpiresAt.Time)) {
			t.Fatalf("at %s A may act, but the controller's lease is %s until %s", clk.Now().Format(time.RFC3339Nano), g.Status.Phase, g.Status.ExpiresAt.Format(time.RFC3339Nano))
		}
	}

	// Renewals get through for 4 s of real time.
	for range 16 {
		step(250 * time.Millisecond)
		eventually(t, "A's renewal loop settles", a.Settled)
		invariant()
		if err := checkErr(a); err != nil {
			t.Fatalf("A lost the lock while renewals got through: %v", err)
		}
	}
	if g := grantOf(t, a.Info().Grant); g.Status.ObservedRenewals < 1 || g.Status.FenceToken != 1 {
		t.Fatalf("after 4 s: %+v, want renewed at least once with fence 1", g.Status)
	}

	// From now on A's renewals are held up in the network.
	fa.hold()
	defer fa.open()
	expiry := grantOf(t, a.Info().Grant).Status.ExpiresAt.Time
	var stoppedAt time.Time
	for clk.Now().Before(expiry.Add(500 * time.Millisecond)) {
		step(250 * time.Millisecond)
		wake(t, a.Info().Grant)
		invariant()
		if stoppedAt.IsZero() && checkErr(a) != nil {
			stoppedAt = clk.Now()
		}
	}
	if stoppedAt.IsZero() || !stoppedAt.Before(expiry) {
		t.Fatalf("A stopped at %s, want before the controller's expiry %s", stoppedAt, expiry)
	}
	eventually(t, "A's context ends", func() bool { return closed(a.Context().Done()) })
	if !errors.Is(context.Cause(a.Context()), lock.ErrOwnershipUnknown) {
		t.Fatalf("A's cause = %v, want ErrOwnershipUnknown", context.Cause(a.Context()))
	}
	b := <-bDone
	if b.err != nil {
		t.Fatal(b.err)
	}
	if _, err := b.h.AwaitRecord(t.Context()); err != nil { // B's status, a moment after its fence record
		t.Fatal(err)
	}
	gb := grantOf(t, b.h.Info().Grant)
	if gb.Status.FenceToken != 2 || gb.Status.GrantedAt.Time.Before(expiry) {
		t.Fatalf("B: fence %d granted at %s; want fence 2, granted no earlier than A's expiry %s", gb.Status.FenceToken, gb.Status.GrantedAt, expiry)
	}
	// A learns the truth by reading: its grant expired.
	fa.open()
	eventually(t, "A reads that its grant expired", func() bool { return a.State() == holder.Expired })
	release(t, a, fencing.ReasonExpired)
	release(t, b.h, "")
}

// A's renew is delayed past the lease. The handle stops at its local
// deadline, learns by reading that the grant expired, and a renew sent then
// is refused EXPIRED, never re-acquiring; the lapse is on A's grant, and A
// gets a new fence when it acquires again. Whether or not B took R meanwhile.
func TestRenewAfterExpiry(t *testing.T) {
	for _, taken := range []bool{false, true} {
		name := map[bool]string{false: "free", true: "taken"}[taken]
		t.Run(name, func(t *testing.T) {
			ns := namespace(t)
			const res = "ledger/c08"
			hclk := clocktesting.NewFakeClock(clk.Now())
			start := clk.Now()
			at := func(s float64) {
				d := start.Add(time.Duration(s * float64(time.Second))).Sub(clk.Now())
				clk.Step(d)
				hclk.Step(d)
			}
			fa := &faulty{WithWatch: as(t, "c08-a")}
			locks := newTestClient(t, fa, lock.WithNamespace(ns), lock.WithClock(hclk))
			// Detached: the late renew below is sent from outside the handle.
			a, err := locks.Acquire(t.Context(), res, lock.WithTTL(2*time.Second), lock.WithDetachedGrant())
			if err != nil {
				t.Fatal(err)
			}
			fa.hold()
			defer fa.open()
			at(0.7) // the renew is due (TTL/3) and sent; the network holds it
			eventually(t, "A is renewing", func() bool { return a.State() == holder.Renewing })
			at(1) // the local deadline: TTL 2 s - margin 1 s
			eventually(t, "A's context ends", func() bool { return closed(a.Context().Done()) })
			if !errors.Is(context.Cause(a.Context()), lock.ErrOwnershipUnknown) {
				t.Fatalf("A's cause = %v, want ErrOwnershipUnknown", context.Cause(a.Context()))
			}
			at(2)
			wake(t, a.Info().Grant)
			waitPhase(t, a.Info().Grant, lockingv1alpha1.PhaseExpired)
			eventually(t, "A reads that its grant expired", func() bool { return a.State() == holder.Expired })
			if taken {
				at(3)
				b, err := newTestClient(t, as(t, "c08-b"), lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithTTL(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				defer b.Release(context.WithoutCancel(t.Context())) //nolint:errcheck // cleanup
			}
			fa.open()
			if n := fa.sent(); n != 0 {
				t.Fatalf("%d renews reached the API server after the local deadline", n)
			}
			at(3.5)
			_, err = locks.Renew(t.Context(), a.Info().Grant, a.Info().UID)
			if !errors.Is(err, fencing.ErrExpired) {
				t.Fatalf("renew at t=3.5: %v, want EXPIRED", err)
			}
			g := grantOf(t, a.Info().Grant)
			if g.Spec.Renewals != 0 || g.Status.Phase != lockingv1alpha1.PhaseExpired {
				t.Fatalf("A's grant after the late renew: renewals %d, phase %s; want 0, Expired", g.Spec.Renewals, g.Status.Phase)
			}
			if c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady); c == nil || c.Reason != fencing.ReasonExpired.ConditionReason() {
				t.Fatalf("Ready condition %+v, want the lapse (Expired) visible", c)
			}
			if !taken {
				a2, err := locks.Acquire(t.Context(), res, lock.WithTTL(2*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if a2.Info().Fence != 2 {
					t.Fatalf("re-acquired fence %d, want 2", a2.Info().Fence)
				}
				release(t, a2, "")
			}
		})
	}
}

// A renew whose reply is lost, or that meets a 409
// Conflict, is resent with the same renewals value: applied exactly once,
// the same fence, no NOT_OWNER for the true owner, and a deadline counted
// from the first attempt's send time. Another identity's renew fails
// NOT_OWNER.
func TestAmbiguousRenew(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(*faulty)
	}{
		{"reply lost", func(f *faulty) { f.loseRenewReplies = 1 }},
		{"every reply lost", func(f *faulty) { f.loseRenewReplies = 100 }},
		{"409 conflict", func(f *faulty) { f.conflictRenews = 1 }},
		{"two conflicts", func(f *faulty) { f.conflictRenews = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			hclk := clocktesting.NewFakeClock(clk.Now())
			elapsed := time.Duration(0)
			step := func(d time.Duration) {
				clk.Step(d)
				hclk.Step(d)
				elapsed += d
			}
			fa := &faulty{WithWatch: as(t, "c10-a")}
			locks := newTestClient(t, fa, lock.WithNamespace(ns), lock.WithClock(hclk))
			a, err := locks.Acquire(t.Context(), "ledger/c10", lock.WithTTL(9*time.Second)) // margin 1 s, renew every 3 s
			if err != nil {
				t.Fatal(err)
			}
			tc.inject(fa)
			step(3 * time.Second) // the renew is due: first attempt at +3s
			for round := 0; !a.Settled(); round++ {
				if round == 10 {
					t.Fatal("the renew never settled")
				}
				// Give the loop time to answer, then let a retry fall due.
				_ = waitUntil(t, 500*time.Millisecond, a.Settled)
				if !a.Settled() {
					step(500 * time.Millisecond)
				}
			}
			g := grantOf(t, a.Info().Grant)
			if g.Spec.Renewals != 1 || g.Status.ObservedRenewals != 1 || g.Status.FenceToken != 1 || g.Status.Phase != lockingv1alpha1.PhaseHeld {
				t.Fatalf("after the ambiguous renew: renewals %d/%d, fence %d, phase %s; want applied once, fence 1, Held",
					g.Spec.Renewals, g.Status.ObservedRenewals, g.Status.FenceToken, g.Status.Phase)
			}
			if err := checkErr(a); err != nil || a.State() != holder.Held {
				t.Fatalf("the true owner: state %s, Check %v; want HELD", a.State(), err)
			}
			// Deadline = first attempt (3 s) + TTL - margin (8 s) = 11 s.
			if want := 11*time.Second - elapsed; remaining(a) != want {
				t.Fatalf("Check leaves %s, want %s (from the first attempt's send time)", remaining(a), want)
			}
			_, err = newTestClient(t, as(t, "c10-b"), lock.WithNamespace(ns)).Renew(t.Context(), a.Info().Grant, a.Info().UID)
			if !errors.Is(err, fencing.ErrDriverMismatch) {
				t.Fatalf("renew of a handle's grant from elsewhere: %v, want DRIVER_MISMATCH", err)
			}
			if err := newTestClient(t, as(t, "c10-b"), lock.WithNamespace(ns)).Release(t.Context(), a.Info().Grant, a.Info().UID); !errors.Is(err, fencing.ErrNotOwner) {
				t.Fatalf("release by another identity: %v; want NOT_OWNER", err)
			}
			fa.loseRenewReplies = 0
			release(t, a, "")
		})
	}
}

// waitUntil polls cond for up to d and reports whether it held.
func waitUntil(t *testing.T, d time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		select {
		case <-t.Context().Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	return cond()
}

// A create whose response was lost is retried under the same request ID:
// one grant, one identity. Its age being unknown, its validity is confirmed
// by a renew before Acquire returns.
func TestLostAcquireResponse(t *testing.T) {
	ns := namespace(t)
	const res, rid = "ledger/lost", "settlement-7-run-1"
	fa := &faulty{WithWatch: as(t, "lost-a"), loseCreateReplies: 1}
	locks := newTestClient(t, fa, lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), res, lock.WithRequestID(rid))
	if err != nil {
		t.Fatal(err)
	}
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{lockingv1alpha1.RequestIDLabel: rid}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].UID != h.Info().UID {
		t.Fatalf("found %d grants for the request, want exactly the handle's", len(list.Items))
	}
	if g := list.Items[0]; g.Spec.Renewals < 1 || g.Status.FenceToken != 1 || h.Info().Fence != 1 {
		t.Fatalf("grant renewals %d, fence %d; want confirmed by a renew, fence 1", g.Spec.Renewals, g.Status.FenceToken)
	}
	// Another process with the same request ID is not a second holder.
	_, err = newTestClient(t, as(t, "lost-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithRequestID(rid))
	if !errors.Is(err, fencing.ErrDriverMismatch) || fencing.ReasonOf(err) != fencing.ReasonDriverMismatch {
		t.Fatalf("a second process with the same request ID: %v, want DRIVER_MISMATCH", err)
	}
	// One that proves it is the same attempt (its session) resumes it.
	again, err := newTestClient(t, as(t, "lost-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithRequestID(rid), lock.WithDriverToken(h.DriverToken()))
	if err != nil {
		t.Fatal(err)
	}
	if again.Info().UID != h.Info().UID || again.Info().Fence != 1 {
		t.Fatalf("retry found uid %s fence %d, want %s fence 1", again.Info().UID, again.Info().Fence, h.Info().UID)
	}
	if _, err := locks.Acquire(t.Context(), "ledger/other", lock.WithRequestID(rid)); !errors.Is(err, lock.ErrRequestIDConflict) {
		t.Fatalf("the request ID reused for another resource: %v, want ErrRequestIDConflict", err)
	}
	release(t, h, "")
	waitPhase(t, h.Info().Grant, lockingv1alpha1.PhaseReleased)
	release(t, again, fencing.ReasonAlreadyEnded)
}

// From the holder's side: a release of an earlier acquisition
// never ends a later one, also when the later one reuses the earlier's name;
// a release after the lease ran out says so.
func TestReleaseOfEarlierAcquisition(t *testing.T) {
	ns := namespace(t)
	const res = "ledger/release"
	locks := newTestClient(t, as(t, "rel-a"), lock.WithNamespace(ns))
	h1, err := locks.Acquire(t.Context(), res)
	if err != nil {
		t.Fatal(err)
	}
	release(t, h1, "")
	h2, err := locks.Acquire(t.Context(), res)
	if err != nil {
		t.Fatal(err)
	}
	release(t, h1, fencing.ReasonAlreadyEnded)
	if _, err := h2.AwaitRecord(t.Context()); err != nil {
		t.Fatal(err)
	}
	if g := grantOf(t, h2.Info().Grant); checkErr(h2) != nil || g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Spec.Release || h2.Info().Fence != 2 {
		t.Fatalf("h2 after h1's second release: Check %v, phase %s, release %v, fence %d", checkErr(h2), g.Status.Phase, g.Spec.Release, h2.Info().Fence)
	}

	// An administrator deletes h1's grant and a new acquisition takes its
	// name (same request ID): h1's UID cannot reach it.
	release(t, h2, "")
	if err := admin.Delete(t.Context(), &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: h1.Info().Grant.Name}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "h1's grant is gone", func() bool {
		var list lockingv1alpha1.LockGrantList
		_ = admin.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{lockingv1alpha1.RequestIDLabel: h1.Info().RequestID})
		return len(list.Items) == 0
	})
	h3, err := locks.Acquire(t.Context(), res, lock.WithRequestID(h1.Info().RequestID))
	if err != nil {
		t.Fatal(err)
	}
	if h3.Info().Grant != h1.Info().Grant || h3.Info().UID == h1.Info().UID || h3.Info().Fence != 3 {
		t.Fatalf("h3: %s uid %s fence %d; want h1's name, a new UID, fence 3", h3.Info().Grant, h3.Info().UID, h3.Info().Fence)
	}
	if err := locks.Release(t.Context(), h1.Info().Grant, h1.Info().UID); !errors.Is(err, fencing.ErrUnknownGrant) {
		t.Fatalf("release with h1's UID: %v; want UNKNOWN_GRANT (no such acquisition)", err)
	}
	if checkErr(h3) != nil || grantOf(t, h3.Info().Grant).Spec.Release {
		t.Fatal("the release aimed at h1 released h3")
	}
	release(t, h3, "")

	// A release that arrives after the lease ran out.
	hclk := clocktesting.NewFakeClock(clk.Now())
	h4, err := locks.Acquire(t.Context(), res, lock.WithTTL(2*time.Second), lock.WithClock(hclk))
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	hclk.Step(2 * time.Second)
	wake(t, h4.Info().Grant)
	waitPhase(t, h4.Info().Grant, lockingv1alpha1.PhaseExpired)
	release(t, h4, fencing.ReasonExpired)
}

// TryAcquire returns at once: ErrBusy (request withdrawn) while another
// grant holds the resource, a handle when it is free.
func TestTryAcquire(t *testing.T) {
	ns := namespace(t)
	const res = "ledger/try"
	a, err := newTestClient(t, as(t, "try-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res)
	if err != nil {
		t.Fatal(err)
	}
	b := newTestClient(t, as(t, "try-b"), lock.WithNamespace(ns))
	if _, err := b.TryAcquire(t.Context(), res, lock.WithRequestID("try-b-1")); !errors.Is(err, lock.ErrBusy) {
		t.Fatalf("TryAcquire of a held resource: %v, want ErrBusy", err)
	}
	waitPhase(t, keyOf(ns, "try-b-1"), lockingv1alpha1.PhaseReleased)
	release(t, a, "")
	hb, err := b.TryAcquire(t.Context(), res, lock.WithRequestID("try-b-2"))
	if err != nil {
		t.Fatal(err)
	}
	if hb.Info().Fence != 2 {
		t.Fatalf("fence %d, want 2 (the withdrawn request got none)", hb.Info().Fence)
	}
	release(t, hb, "")
}

// The wait limit is the registry's: a request past it ends TimedOut and
// Acquire returns ErrWaitTimeout. A cancelled Acquire withdraws its request.
// Progress reports the queue position.
func TestAcquireWaitLimitAndCancel(t *testing.T) {
	ns := namespace(t)
	const res = "ledger/wait"
	a, err := newTestClient(t, as(t, "wait-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithTTL(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b := newTestClient(t, as(t, "wait-b"), lock.WithNamespace(ns))
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(t.Context(), res, lock.WithWait(2*time.Second), lock.WithRequestID("wait-b-1"))
		errc <- err
	}()
	waitPhase(t, keyOf(ns, "wait-b-1"), lockingv1alpha1.PhasePending)
	clk.Step(2100 * time.Millisecond)
	wake(t, keyOf(ns, "wait-b-1"))
	if err := <-errc; !errors.Is(err, lock.ErrWaitTimeout) {
		t.Fatalf("Acquire past its wait limit: %v, want ErrWaitTimeout", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	progress := make(chan int32, 16)
	go func() {
		_, err := b.Acquire(ctx, res, lock.WithRequestID("wait-b-2"), lock.WithProgress(func(g *lockingv1alpha1.LockGrant) {
			if g.Status.QueuePosition != nil {
				select {
				case progress <- *g.Status.QueuePosition:
				default:
				}
			}
		}))
		errc <- err
	}()
	if pos := <-progress; pos != 0 {
		t.Fatalf("queue position %d, want 0", pos)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
	}
	waitPhase(t, keyOf(ns, "wait-b-2"), lockingv1alpha1.PhaseReleased)
	release(t, a, "")
}

// A request granted after waiting in the queue longer than TTL - margin (by
// the holder's clock) cannot count from its create's send time: it is
// confirmed by a renew, and its deadline counts from that renew.
func TestGrantedAfterLongWait(t *testing.T) {
	ns := namespace(t)
	const res = "ledger/long"
	a, err := newTestClient(t, as(t, "long-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res)
	if err != nil {
		t.Fatal(err)
	}
	hclk := clocktesting.NewFakeClock(clk.Now())
	got := make(chan *lock.Handle, 1)
	go func() {
		h, err := newTestClient(t, as(t, "long-b"), lock.WithNamespace(ns), lock.WithClock(hclk)).
			Acquire(t.Context(), res, lock.WithTTL(10*time.Second), lock.WithRequestID("long-b"))
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	waitPhase(t, keyOf(ns, "long-b"), lockingv1alpha1.PhasePending)
	hclk.Step(30 * time.Second) // B waited 30 s by its own clock
	release(t, a, "")
	b := <-got
	if b == nil {
		t.FailNow()
	}
	if g := grantOf(t, b.Info().Grant); g.Spec.Renewals != 1 || b.Info().Fence != 2 || remaining(b) != 9*time.Second {
		t.Fatalf("B: renewals %d, fence %d, remaining %s; want confirmed by one renew, fence 2, 9s", g.Spec.Renewals, b.Info().Fence, remaining(b))
	}
	release(t, b, "")
}

// A request granted late in its TTL (after waiting 16 s for a 20 s lease,
// by the holder's clock) is usable for a full lease: it is confirmed by a
// renew before Acquire returns, and its deadline counts from that renew,
// not from the create that leaves it 2 s. Past the create's deadline it
// still holds.
func TestGrantedLateInTheTTL(t *testing.T) {
	ns := namespace(t)
	const res = "ledger/late"
	a, err := newTestClient(t, as(t, "late-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res)
	if err != nil {
		t.Fatal(err)
	}
	hclk := clocktesting.NewFakeClock(clk.Now())
	got := make(chan *lock.Handle, 1)
	go func() {
		h, err := newTestClient(t, as(t, "late-b"), lock.WithNamespace(ns), lock.WithClock(hclk)).
			Acquire(t.Context(), res, lock.WithTTL(20*time.Second), lock.WithRequestID("late-b"))
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	waitPhase(t, keyOf(ns, "late-b"), lockingv1alpha1.PhasePending)
	hclk.Step(16 * time.Second) // B waited 16 s by its own clock
	release(t, a, "")
	b := <-got
	if b == nil {
		t.FailNow()
	}
	// TTL 20 s, margin 2 s: 18 s from the renew, sent 0 s ago on B's clock.
	if g := grantOf(t, b.Info().Grant); g.Spec.Renewals != 1 || remaining(b) != 18*time.Second {
		t.Fatalf("B when Acquire returned: renewals %d, remaining %s; want confirmed by one renew, 18s", g.Spec.Renewals, remaining(b))
	}
	hclk.Step(3 * time.Second) // past the create's send time + TTL - margin
	if err := checkErr(b); err != nil || remaining(b) != 15*time.Second {
		t.Fatalf("B 19 s after its create: Check %v, remaining %s; want held, 15s", err, remaining(b))
	}
	release(t, b, "")
}

// WatchTransitions reports each grant's phase changes, from the watch.
func TestWatchTransitions(t *testing.T) {
	ns := namespace(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	trs := make(chan lock.Transition, 64)
	go func() {
		_ = lock.WatchTransitions(ctx, admin, func(tr lock.Transition) error { trs <- tr; return nil }, client.InNamespace(ns))
	}()
	locks := newTestClient(t, as(t, "watch-a"), lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), "ledger/watch")
	if err != nil {
		t.Fatal(err)
	}
	// Held in status too before the release: a grant released at once,
	// before its Held status was written, goes from Pending to Released.
	if _, err := h.AwaitRecord(t.Context()); err != nil {
		t.Fatal(err)
	}
	release(t, h, "")
	if err := admin.Delete(t.Context(), &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: h.Info().Grant.Name}}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	timeout := time.After(20 * time.Second)
	for len(seen) < 3 {
		select {
		case tr := <-trs:
			if tr.Grant.UID != h.Info().UID {
				continue
			}
			s := string(tr.To)
			if tr.Deleted {
				s = "deleted"
			}
			seen = append(seen, s)
		case <-timeout:
			t.Fatalf("transitions seen: %v", seen)
		}
	}
	if want := []string{"Held", "Released", "deleted"}; seen[0] != want[0] || seen[1] != want[1] || seen[2] != want[2] {
		t.Fatalf("transitions %v, want %v", seen, want)
	}
}

func TestPhaseChanged(t *testing.T) {
	p := lock.PhaseChanged()
	g := func(phase lockingv1alpha1.LockGrantPhase, fence, renewals int64) *lockingv1alpha1.LockGrant {
		return &lockingv1alpha1.LockGrant{Status: lockingv1alpha1.LockGrantStatus{Phase: phase, FenceToken: fence, ObservedRenewals: renewals}}
	}
	for _, tc := range []struct {
		old, new *lockingv1alpha1.LockGrant
		want     bool
	}{
		{g("Pending", 0, 0), g("Held", 3, 0), true},
		{g("Held", 3, 0), g("Held", 3, 1), false},
		{g("Held", 3, 1), g("Expired", 3, 1), true},
	} {
		if got := p.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s -> %s: %v, want %v", tc.old.Status.Phase, tc.new.Status.Phase, got, tc.want)
		}
	}
	if !p.Create(event.CreateEvent{Object: g("", 0, 0)}) || !p.Delete(event.DeleteEvent{Object: g("Held", 1, 0)}) {
		t.Error("creations and deletions must pass")
	}
}
