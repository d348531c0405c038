package grantplan

import (
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
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
	if s := statusOf(p, "b"); s == nil || findCond(s, lockingv1alpha1.ConditionReady).Reason != lockingv1alpha1.LockGrantReasonLockDelay {
		t.Fatalf("b = %+v, want Pending with reason %s", s, lockingv1alpha1.LockGrantReasonLockDelay)
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

// delaying is a grant asking for a 2 s lock-delay.
func delaying(g lockingv1alpha1.LockGrant) lockingv1alpha1.LockGrant {
	g.Spec.LockDelaySeconds = 2
	return g
}

// namedBy is the counter of slot k naming holder with fence, with the
// lock-delay the holder asked for recorded as the controller records it.
func namedBy(k int32, fence int64, holder *lockingv1alpha1.LockGrant) *lockingv1alpha1.FenceCounter {
	c := slotCounter(k, fence, holder)
	if k == 0 {
		c.Spec.Resource = res
	}
	if holder != nil {
		c.Spec.Holder.LockDelaySeconds = holder.Spec.LockDelaySeconds
	}
	return c
}

// next returns the facts after the plan's writes have all landed, at now:
// its counters and its statuses.
func next(f Facts, p Plan, now time.Time) Facts {
	f = applied(f, p)
	f.Now = now
	grants := make([]lockingv1alpha1.LockGrant, len(f.Grants))
	for i, g := range f.Grants {
		grants[i] = g
		for _, s := range p.Statuses {
			if s.UID == g.UID {
				grants[i] = *s.DeepCopy()
			}
		}
	}
	f.Grants = grants
	return f
}

// slotOf is the counter spec of slot k as planned, nil when it does not
// change.
func slotOf(p Plan, k int32) *lockingv1alpha1.FenceCounterSpec {
	if k == 0 {
		return p.Counter
	}
	return p.SlotCounters[k]
}

// Every way a slot's holder leaves it without a release keeps the slot for
// the holder's lock-delay, counted from the pass that frees it: the next
// in line is not granted the slot before it ends, nor anyone behind it, and
// is granted it once it has ended. Only a release by the owner frees the
// slot at once. The two deciders' race is among those ways: when one
// waiter was granted two slots, the slot it does not keep is freed with its
// lock-delay too, whichever slot its status names as read, since the pass
// cannot know whether the other decider's status write (naming the slot
// it frees) landed after its read and reached the holder.
func TestLockDelayOnEveryWayASlotIsFreed(t *testing.T) {
	const epoch1 = 1 << 40 // a fence of issuer epoch 1
	type setup struct {
		f Facts
		// slot is the slot freed, with the lock-delay when delayed.
		slot    int32
		delayed bool
	}
	// Three permits: z holds slot 0 and y slot 2 for a minute; h holds
	// slot 1 and leaves it at t=10 in each case; w waits, and v behind it.
	base := func() (z, y, h, w, v lockingv1alpha1.LockGrant) {
		z = heldIn(withPermits(grant("z", 0.1, 60), 3), 0, 7, 60)
		y = heldIn(withPermits(grant("y", 0.2, 60), 3), 2, 4, 60)
		h = heldIn(delaying(withPermits(grant("h", 0.3, 60), 3)), 1, 3, 60)
		w = withPermits(grant("w", 5, 60), 3)
		v = withPermits(grant("v", 6, 60), 3)
		return z, y, h, w, v
	}
	facts := func(grants []lockingv1alpha1.LockGrant, counters ...*lockingv1alpha1.FenceCounter) Facts {
		f := Facts{Now: sec(10), Resource: res, Grants: grants, SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{}}
		for k, c := range counters {
			if k == 0 {
				f.Counter = c
			} else if c != nil {
				f.SlotCounters[int32(k)] = c
			}
		}
		return f
	}
	cases := map[string]func() setup{
		"lease expired": func() setup {
			z, y, h, w, v := base()
			h = heldIn(h, 1, 3, 10)
			return setup{facts([]lockingv1alpha1.LockGrant{z, y, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 4, &y)), 1, true}
		},
		"session lapsed": func() setup {
			z, y, h, w, v := base()
			h = withSession(h, "s-h")
			f := facts([]lockingv1alpha1.LockGrant{z, y, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 4, &y))
			f.Sessions = map[string]*fencing.Session{"s-h": session("s-h", "owner-h", 4)} // lapsed at 9
			return setup{f, 1, true}
		},
		"issuer epoch revoked": func() setup {
			z, y, h, w, v := base()
			z, y = heldIn(z, 0, epoch1+7, 60), heldIn(y, 2, epoch1+4, 60)
			f := facts([]lockingv1alpha1.LockGrant{z, y, h, w, v}, namedBy(0, epoch1+7, &z), namedBy(1, 3, &h), namedBy(2, epoch1+4, &y))
			f.Epoch, f.Revoked = 1, []int64{0}
			return setup{f, 1, true}
		},
		"policy gone": func() setup {
			z, y, h, w, v := base()
			h.Spec.Policy = "settlements"
			f := facts([]lockingv1alpha1.LockGrant{z, y, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 4, &y))
			f.Policies = map[string]*lockingv1alpha1.GuardPolicy{"settlements": nil}
			return setup{f, 1, true}
		},
		"grant deleted": func() setup {
			z, y, h, w, v := base()
			return setup{facts([]lockingv1alpha1.LockGrant{z, y, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 4, &y)), 1, true}
		},
		"superseded in the slot its status names": func() setup {
			// h's status names slot 2, whose counter names y; slot 1's
			// counter names h, which a racing decider granted it.
			z, y, h, w, v := base()
			h = heldIn(h, 2, 3, 60)
			return setup{facts([]lockingv1alpha1.LockGrant{z, y, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 4, &y)), 1, true}
		},
		"two slots, the status read names the other": func() setup {
			// Two deciders granted h slots 1 and 2; its status, as read,
			// names slot 2, so slot 1 is freed. (The fault simulation's
			// round: a second decider acting on an older read.)
			z, _, h, w, v := base()
			h = heldIn(h, 2, 6, 60)
			return setup{facts([]lockingv1alpha1.LockGrant{z, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 6, &h)), 1, true}
		},
		"two slots, the status read names neither": func() setup {
			// Read before either status write landed: h converges on
			// slot 1 and slot 2 is freed, though the other decider's
			// status write naming slot 2 may have landed since.
			z, _, _, w, v := base()
			h := delaying(withPermits(grant("h", 0.3, 60), 3)) // Pending
			lease := lockingv1alpha1.FormatInstant(sec(60))
			h1, h2 := namedBy(1, 3, &h), namedBy(2, 6, &h)
			h1.Spec.Holder.ExpiresAt, h2.Spec.Holder.ExpiresAt = lease, lease
			return setup{facts([]lockingv1alpha1.LockGrant{z, h, w, v}, namedBy(0, 7, &z), h1, h2), 2, true}
		},
		"released": func() setup {
			z, y, h, w, v := base()
			h.Spec.Release = true
			return setup{facts([]lockingv1alpha1.LockGrant{z, y, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 4, &y)), 1, false}
		},
		"two slots, released": func() setup {
			z, _, h, w, v := base()
			h = heldIn(h, 2, 6, 60)
			h.Spec.Release = true
			return setup{facts([]lockingv1alpha1.LockGrant{z, h, w, v}, namedBy(0, 7, &z), namedBy(1, 3, &h), namedBy(2, 6, &h)), 1, false}
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s := c()
			p := Decide(s.f)
			if !s.delayed {
				if got := grantedNames(p); len(got) == 0 || got[0] != "w" || p.Granted[0].HeldSlot() != s.slot {
					t.Fatalf("granted %v, want w in slot %d at once", got, s.slot)
				}
				return
			}
			c := slotOf(p, s.slot)
			if c == nil || c.Holder != nil || !delayUntil(c).Equal(sec(12)) {
				t.Fatalf("slot %d counter = %+v, want freed with the lock-delay until t=12", s.slot, c)
			}
			if got := grantedNames(p); len(got) != 0 {
				t.Fatalf("granted %v during slot %d's lock-delay", got, s.slot)
			}
			if st := statusOf(p, "w"); st == nil || readyReason(st) != lockingv1alpha1.LockGrantReasonLockDelay {
				t.Fatalf("w = %+v, want the head waiting out the lock-delay", st)
			}
			f := next(s.f, p, sec(11.9))
			if p := Decide(f); len(p.Granted) != 0 {
				t.Fatalf("granted %v at t=11.9, during the lock-delay", grantedNames(p))
			}
			f = next(f, Decide(f), sec(12))
			p = Decide(f)
			if got := grantedNames(p); len(got) == 0 || got[0] != "w" || p.Granted[0].HeldSlot() != s.slot {
				t.Fatalf("at t=12 granted %v, want w in slot %d", got, s.slot)
			}
		})
	}
}

// A slot above a lowered limit keeps its lock-delay: freed while the limit
// is 1, it is not granted before the delay ends once the limit is raised
// again.
func TestLockDelayOfASlotAboveALoweredLimit(t *testing.T) {
	z := heldIn(withPermits(grant("z", 0.1, 60), 3), 0, 7, 60)
	h := heldIn(delaying(withPermits(grant("h", 0.2, 60), 3)), 1, 3, 10)
	low := withPermits(grant("low", 4, 60), 1)
	w := withPermits(grant("w", 5, 60), 3)
	f := Facts{Now: sec(10), Resource: res, Counter: namedBy(0, 7, &z), Grants: []lockingv1alpha1.LockGrant{z, h, low, w},
		SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{1: namedBy(1, 3, &h)}}
	p := Decide(f)
	if c := p.SlotCounters[1]; c == nil || c.Holder != nil || !delayUntil(c).Equal(sec(12)) {
		t.Fatalf("slot 1 counter = %+v, want freed with the lock-delay until t=12 above the limit of 1", c)
	}
	// The request that lowered the limit is withdrawn: the limit is 3
	// again, and w, now the head, waits out slot 1's delay (slot 2 has
	// never been granted: it is free).
	f = next(f, p, sec(11))
	for i := range f.Grants {
		if f.Grants[i].Name == "low" {
			f.Grants[i].Spec.Release = true
		}
	}
	p = Decide(f)
	if got := grantedNames(p); len(got) != 1 || got[0] != "w" || p.Granted[0].HeldSlot() != 2 {
		t.Fatalf("at t=11 granted %v, want w in slot 2, the lowest slot free of a lock-delay", got)
	}
	if c := p.SlotCounters[1]; c != nil {
		t.Fatalf("slot 1 counter rewritten during its lock-delay: %+v", c)
	}
}
