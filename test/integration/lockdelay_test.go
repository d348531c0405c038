package integration

import (
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func withLockDelay(s int32) func(*lockingv1alpha1.LockGrant) {
	return func(g *lockingv1alpha1.LockGrant) { g.Spec.LockDelaySeconds = s }
}

// A lease that expires with a lock-delay keeps the resource from the next
// waiter for that long: the waiter says why it waits, the counter keeps the
// instant, and the waiter is granted with the next fence once it passed.
func TestLockDelayAfterExpiry(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a, err := acquire(t, as(t, "delay-a"), ns, 10, withLockDelay(20))
	if err != nil {
		t.Fatal(err)
	}
	a = waitPhase(t, a, lockingv1alpha1.PhaseHeld)
	b, err := acquire(t, as(t, "delay-b"), ns, 10)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, lockingv1alpha1.PhasePending)

	tl.at(10)
	wake(t, a)
	waitPhase(t, a, lockingv1alpha1.PhaseExpired)
	waitFor(t, b, "waiting out the lock-delay", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.Phase == lockingv1alpha1.PhasePending && readyReasonOf(g) == lockingv1alpha1.LockGrantReasonLockDelay
	})
	c := counterOf(t, ns)
	if c.Spec.Holder != nil || c.Spec.LockDelayUntil == "" || mustTime(t, c.Spec.LockDelayUntil).Before(tl.t(30)) {
		t.Fatalf("counter after the expiry = %+v, want free with a lock-delay until t=30 or later", c.Spec)
	}

	tl.at(30.5)
	wake(t, b)
	b = waitPhase(t, b, lockingv1alpha1.PhaseHeld)
	if b.Status.FenceToken <= a.Status.FenceToken {
		t.Fatalf("b's fence %d, want above a's %d", b.Status.FenceToken, a.Status.FenceToken)
	}
	if c := counterOf(t, ns); c.Spec.LockDelayUntil != "" {
		t.Fatalf("counter after the grant = %+v, want the lock-delay cleared", c.Spec)
	}
}

// A release ends a grant without its lock-delay: the next waiter holds at
// once, with no step of the clock.
func TestNoLockDelayAfterRelease(t *testing.T) {
	ns := namespace(t)
	a, err := acquire(t, as(t, "nodelay-a"), ns, 60, withLockDelay(600))
	if err != nil {
		t.Fatal(err)
	}
	a = waitPhase(t, a, lockingv1alpha1.PhaseHeld)
	b, err := acquire(t, as(t, "nodelay-b"), ns, 60)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, lockingv1alpha1.PhasePending)
	if err := release(t, as(t, "nodelay-a"), a); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, lockingv1alpha1.PhaseHeld)
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
