package grantplan

import (
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// delayedHolder is a Held grant with a lock-delay of delay seconds, and the
// counter that names it.
func delayedHolder(delay int32, expires float64) (lockingv1alpha1.LockGrant, *lockingv1alpha1.FenceCounter) {
	a := held(grant("a", 0, 5), 1, expires)
	a.Spec.LockDelaySeconds = delay
	c := counter(1, &a)
	c.Spec.Holder.LockDelaySeconds = delay
	return a, c
}

// After a lease expires, the next waiter waits out the holder's lock-delay,
// counted from the expiry the controller saw; the counter keeps the instant
// and the head of the queue says why it waits.
func TestLockDelayAfterExpiry(t *testing.T) {
	a, c := delayedHolder(3, 5)
	b := grant("b", 1, 5)
	p := Decide(Facts{Now: sec(5), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a, b}})
	if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired {
		t.Fatalf("a at its expiry = %+v, want Expired", s)
	}
	if len(p.Granted) != 0 {
		t.Fatalf("b granted during a's lock-delay")
	}
	if p.Counter == nil || p.Counter.Holder != nil || p.Counter.Fence != 1 || !delayUntil(p.Counter).Equal(sec(8)) {
		t.Fatalf("counter = %+v, want free at fence 1 with the delay until t=8", p.Counter)
	}
	if s := statusOf(p, "b"); s == nil || findCond(s, lockingv1alpha1.ConditionReady).Reason != ReasonLockDelay {
		t.Fatalf("b = %+v, want Pending with reason %s", s, ReasonLockDelay)
	}
	if p.RequeueAfter != 3*time.Second {
		t.Fatalf("requeueAfter = %v, want the 3 s to the delay's end", p.RequeueAfter)
	}

	// The next pass, from the counter alone: still delayed at 7.9, granted
	// at 8 with the next fence and the delay cleared.
	freed := &lockingv1alpha1.FenceCounter{Spec: *p.Counter}
	ended := *statusOf(p, "a")
	a.Status = ended
	if p := Decide(Facts{Now: sec(7.9), Resource: res, Counter: freed, Grants: []lockingv1alpha1.LockGrant{a, b}}); len(p.Granted) != 0 || p.Counter != nil {
		t.Fatalf("at t=7.9 the plan grants or moves the counter: %+v", p.Counter)
	}
	p = Decide(Facts{Now: sec(8), Resource: res, Counter: freed, Grants: []lockingv1alpha1.LockGrant{a, b}})
	if len(p.Granted) == 0 || p.Granted[0].Name != "b" || p.Counter.Fence != 2 || p.Counter.LockDelayUntil != "" {
		t.Fatalf("at t=8: granted %v, counter %+v; want b with fence 2 and no delay", p.Granted, p.Counter)
	}
}

// A release ends the grant without lock-delay: the next waiter is granted in
// the same pass.
func TestNoLockDelayAfterRelease(t *testing.T) {
	a, c := delayedHolder(3, 5)
	a.Spec.Release = true
	b := grant("b", 1, 5)
	p := Decide(Facts{Now: sec(2), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a, b}})
	if len(p.Granted) == 0 || p.Granted[0].Name != "b" || p.Counter.LockDelayUntil != "" {
		t.Fatalf("after a release: granted %v, counter %+v; want b at once", p.Granted, p.Counter)
	}
}

// A holder whose grant was deleted while it held (a forced release) gets its
// lock-delay from the counter, where it was recorded at grant time.
func TestLockDelayOfADeletedHolder(t *testing.T) {
	_, c := delayedHolder(2, 5)
	b := grant("b", 1, 5)
	p := Decide(Facts{Now: sec(3), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{b}})
	if len(p.Granted) != 0 || p.Counter == nil || !delayUntil(p.Counter).Equal(sec(5)) {
		t.Fatalf("after the holder's grant vanished: granted %v, counter %+v; want nobody until t=5", p.Granted, p.Counter)
	}
}

// The grant's lock-delay is recorded on the counter with its holder.
func TestLockDelayRecordedWithTheHolder(t *testing.T) {
	b := grant("b", 1, 5)
	b.Spec.LockDelaySeconds = 4
	p := Decide(Facts{Now: sec(2), Resource: res, Counter: counter(0, nil), Grants: []lockingv1alpha1.LockGrant{b}})
	if p.Counter == nil || p.Counter.Holder == nil || p.Counter.Holder.LockDelaySeconds != 4 {
		t.Fatalf("counter = %+v, want b named with its 4 s lock-delay", p.Counter)
	}
}

// delayUntil reads the lock-delay a counter spec carries; zero for none.
func delayUntil(c *lockingv1alpha1.FenceCounterSpec) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, c.LockDelayUntil)
	return t
}

// A lock-delay the controller cannot read (a counter edited by hand) keeps
// the resource from being granted: fail closed.
func TestUnreadableLockDelayGrantsNobody(t *testing.T) {
	c := counter(1, nil)
	c.Spec.LockDelayUntil = "yesterday"
	p := Decide(Facts{Now: sec(2), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{grant("b", 1, 5)}})
	if len(p.Granted) != 0 {
		t.Fatalf("granted under an unreadable lock-delay")
	}
}
