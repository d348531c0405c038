package grantplan

import (
	"testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The counter carries the live lease: it records the end of every grant
// and every renew, and the holder's expiry is judged on it, whatever the
// grant's status says.
func TestDecideCounterCarriesTheLease(t *testing.T) {
	t.Run("a grant records its lease end in the counter", func(t *testing.T) {
		p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(3, nil), Grants: []lockingv1alpha1.LockGrant{grant("a", 0.5, 5)}})
		if p.Counter == nil || p.Counter.Holder == nil || p.Counter.Holder.ExpiresAt != lockingv1alpha1.FormatInstant(sec(6)) {
			t.Fatalf("counter = %+v, want a's lease end t=6 recorded", p.Counter)
		}
	})
	t.Run("a renew is recorded in the counter, same holder and fence", func(t *testing.T) {
		a := held(grant("a", 0, 5), 1, 5)
		a.Spec.Renewals = 1
		p := Decide(Facts{Now: sec(4), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
		if p.Counter == nil || p.Counter.Fence != 1 || p.Counter.Holder.UID != string(a.UID) || p.Counter.Holder.ExpiresAt != lockingv1alpha1.FormatInstant(sec(9)) {
			t.Fatalf("counter = %+v, want a still holding fence 1 until t=9", p.Counter)
		}
	})
	t.Run("expiry is judged on the counter, not on a status that says later", func(t *testing.T) {
		a := held(grant("a", 0, 5), 1, 9)
		c := counter(1, &a)
		c.Spec.Holder.ExpiresAt = lockingv1alpha1.FormatInstant(sec(5))
		p := Decide(Facts{Now: sec(5), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a, grant("b", 1, 5)}})
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired {
			t.Fatalf("a = %+v, want Expired at the counter's t=5", s)
		}
		if p.Counter == nil || p.Counter.Holder == nil || p.Counter.Holder.Name != "b" || p.Counter.Fence != 2 {
			t.Fatalf("counter = %+v, want b with fence 2", p.Counter)
		}
	})
	t.Run("a renew recorded in the status alone, by an earlier version, goes into the counter while it is live", func(t *testing.T) {
		a := held(grant("a", 0, 5), 1, 9)
		c := counter(1, &a)
		c.Spec.Holder.ExpiresAt = lockingv1alpha1.FormatInstant(sec(5))
		p := Decide(Facts{Now: sec(3), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a, grant("b", 1, 5)}})
		if p.Counter == nil || p.Counter.Fence != 1 || p.Counter.Holder.UID != string(a.UID) || p.Counter.Holder.ExpiresAt != lockingv1alpha1.FormatInstant(sec(9)) {
			t.Fatalf("counter = %+v, want a still holding fence 1 until t=9", p.Counter)
		}
		if s := statusOf(p, "a"); s != nil && s.Phase != lockingv1alpha1.PhaseHeld {
			t.Fatalf("a = %+v, want it still Held", s)
		}
	})
	t.Run("a holder whose Held status was lost gets the counter's lease end, not a new one", func(t *testing.T) {
		a := grant("a", 0, 5)
		c := counter(1, nil)
		c.Spec.Holder = &lockingv1alpha1.FenceHolder{Name: a.Name, UID: string(a.UID), Owner: a.Spec.Owner, Fence: 1, ExpiresAt: lockingv1alpha1.FormatInstant(sec(5))}
		p := Decide(Facts{Now: sec(2), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a}})
		if p.Counter != nil {
			t.Fatalf("counter rewritten to %+v; a holds until t=5", p.Counter)
		}
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseHeld || s.FenceToken != 1 || !s.ExpiresAt.Time.Equal(sec(5)) {
			t.Fatalf("a = %+v, want Held with fence 1 until the counter's t=5", s)
		}
	})
	t.Run("a renew recorded in the counter whose status write was lost keeps the holder", func(t *testing.T) {
		a := held(grant("a", 0, 5), 1, 5)
		c := counter(1, &a)
		c.Spec.Holder.ExpiresAt = lockingv1alpha1.FormatInstant(sec(9))
		p := Decide(Facts{Now: sec(6), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a, grant("b", 1, 5)}})
		if p.Counter != nil {
			t.Fatalf("counter rewritten to %+v; a holds until t=9", p.Counter)
		}
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseHeld || !s.ExpiresAt.Time.Equal(sec(9)) {
			t.Fatalf("a = %+v, want its status to mirror the counter's t=9", s)
		}
	})
	t.Run("a lease end that cannot be read is over (fail closed)", func(t *testing.T) {
		a := held(grant("a", 0, 5), 1, 60)
		c := counter(1, &a)
		c.Spec.Holder.ExpiresAt = "soon"
		p := Decide(Facts{Now: sec(1), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{a, grant("b", 0.5, 5)}})
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired {
			t.Fatalf("a = %+v, want Expired", s)
		}
		if p.Counter == nil || p.Counter.Holder == nil || p.Counter.Holder.Name != "b" || p.Counter.Fence != 2 {
			t.Fatalf("counter = %+v, want b with fence 2, never a lower one", p.Counter)
		}
	})
	t.Run("a counter written before it carried the lease", func(t *testing.T) {
		a := held(grant("a", 0, 5), 1, 5)
		p := Decide(Facts{Now: sec(2), Resource: res, Counter: legacyCounter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
		if p.Counter != nil || len(p.Statuses) != 0 {
			t.Fatalf("plan = %+v, want nothing: the status' lease is judged, and nothing changed", p)
		}
		p = Decide(Facts{Now: sec(5), Resource: res, Counter: legacyCounter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired {
			t.Fatalf("a = %+v, want Expired at its status' t=5", s)
		}
		a.Spec.Renewals = 1
		p = Decide(Facts{Now: sec(2), Resource: res, Counter: legacyCounter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
		if p.Counter == nil || p.Counter.Holder.ExpiresAt != lockingv1alpha1.FormatInstant(sec(7)) {
			t.Fatalf("counter = %+v, want the renew's t=7 recorded", p.Counter)
		}
	})
}

// After the counters move, the ended holders' statuses are written first,
// then the new holder's: no two grants ever read Held at once.
func TestDecideWritesTheEndedHolderFirst(t *testing.T) {
	a := held(grant("a", 0, 5), 1, 5)
	a.Spec.Release = true
	stale := held(grant("s", 0.1, 5), 0, 5) // Held in its status, not named: a lost write
	p := Decide(Facts{Now: sec(2), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{grant("b", 1, 5), stale, a}})
	var order []string
	for i, g := range p.Statuses {
		order = append(order, g.Name+"="+string(g.Status.Phase))
		if g.Name == "b" && (i != 2 || g.Status.Phase != lockingv1alpha1.PhaseHeld) {
			t.Fatalf("status writes %v, want a and s ended before b becomes Held", order)
		}
		if g.Name != "b" && !g.Status.Phase.Final() {
			t.Fatalf("status writes %v, want %s ended", order, g.Name)
		}
	}
	if len(order) != 3 {
		t.Fatalf("status writes %v, want three", order)
	}
}
