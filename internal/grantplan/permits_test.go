package grantplan

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// withPermits is a request for one of n permits.
func withPermits(g lockingv1alpha1.LockGrant, n int32) lockingv1alpha1.LockGrant {
	g.Spec.Permits = n
	return g
}

// heldIn is g Held in slot k with fence.
func heldIn(g lockingv1alpha1.LockGrant, k int32, fence int64, expires float64) lockingv1alpha1.LockGrant {
	g = held(g, fence, expires)
	g.Status.Permit, g.Status.FencedResource = &k, lockingv1alpha1.SlotResource(res, k)
	return g
}

// slotCounter is the counter of slot k, held by holder with fence.
func slotCounter(k int32, fence int64, holder *lockingv1alpha1.LockGrant) *lockingv1alpha1.FenceCounter {
	c := counter(fence, holder)
	c.Spec.Resource = lockingv1alpha1.SlotResource(res, k)
	return c
}

// applied returns the counters after the plan's writes.
func applied(f Facts, p Plan) Facts {
	if p.Counter != nil {
		f.Counter = &lockingv1alpha1.FenceCounter{Spec: *p.Counter}
	}
	slots := map[int32]*lockingv1alpha1.FenceCounter{}
	for k, c := range f.SlotCounters {
		slots[k] = c
	}
	for k, s := range p.SlotCounters {
		slots[k] = &lockingv1alpha1.FenceCounter{Spec: *s}
	}
	f.SlotCounters = slots
	return f
}

func grantedNames(p Plan) []string {
	var names []string
	for _, g := range p.Granted {
		names = append(names, g.Name)
	}
	return names
}

// The head of the queue gets the lowest free slot, in FIFO order, until the
// limit; each slot's fence starts from its own counter.
func TestPermitsGrantLowestFreeSlotsInFIFOOrder(t *testing.T) {
	gs := []lockingv1alpha1.LockGrant{
		withPermits(grant("e", 0.5, 5), 3), withPermits(grant("a", 0.1, 5), 3), withPermits(grant("c", 0.3, 5), 3),
		withPermits(grant("b", 0.2, 5), 3), withPermits(grant("d", 0.4, 5), 3),
	}
	f := Facts{Now: sec(1), Resource: res, Counter: counter(7, nil), SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{2: slotCounter(2, 40, nil)}, Grants: gs}
	p := Decide(f)
	if got := grantedNames(p); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Fatalf("granted %v, want a, b, c", got)
	}
	want := map[string]struct {
		slot  int32
		fence int64
		id    string
	}{"a": {0, 8, res}, "b": {1, 1, res + "#1"}, "c": {2, 41, res + "#2"}}
	for name, w := range want {
		s := statusOf(p, name)
		if s == nil || s.Phase != lockingv1alpha1.PhaseHeld || s.Permit == nil || *s.Permit != w.slot || s.FenceToken != w.fence || s.FencedResource != w.id {
			t.Fatalf("%s: status %+v; want Held in permit %d (%s) with fence %d", name, s, w.slot, w.id, w.fence)
		}
	}
	if p.Counter == nil || p.Counter.Holder.Name != "a" || p.Counter.Resource != res {
		t.Fatalf("slot 0 counter = %+v, want held by a", p.Counter)
	}
	for k, name := range map[int32]string{1: "b", 2: "c"} {
		c := p.SlotCounters[k]
		if c == nil || c.Holder == nil || c.Holder.Name != name || c.Resource != lockingv1alpha1.SlotResource(res, k) {
			t.Fatalf("slot %d counter = %+v, want held by %s", k, c, name)
		}
	}
	for _, name := range []string{"d", "e"} {
		if s := statusOf(p, name); s == nil || s.Phase != lockingv1alpha1.PhasePending {
			t.Fatalf("%s: %+v, want Pending", name, s)
		}
	}
}

// A release hands its slot to the head of the queue with the slot's next
// fence; the other slots are untouched.
func TestPermitsReleaseHandsTheSlotOver(t *testing.T) {
	a := heldIn(withPermits(grant("a", 0.1, 60), 3), 0, 8, 60)
	b := heldIn(withPermits(grant("b", 0.2, 60), 3), 1, 1, 60)
	c := heldIn(withPermits(grant("c", 0.3, 60), 3), 2, 41, 60)
	b.Spec.Release = true
	d := withPermits(grant("d", 0.4, 60), 3)
	f := Facts{Now: sec(2), Resource: res, Counter: counter(8, &a), Grants: []lockingv1alpha1.LockGrant{a, b, c, d},
		SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, 1, &b), 2: slotCounter(2, 41, &c)}}
	p := Decide(f)
	if s := statusOf(p, "b"); s == nil || s.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("b: %+v, want Released", s)
	}
	if s := statusOf(p, "d"); s == nil || s.Permit == nil || *s.Permit != 1 || s.FenceToken != 2 || s.FencedResource != res+"#1" {
		t.Fatalf("d: %+v, want permit 1 with fence 2", s)
	}
	if p.Counter != nil || p.SlotCounters[2] != nil || p.SlotCounters[1] == nil || p.SlotCounters[1].Holder.Name != "d" {
		t.Fatalf("counters: slot 0 %+v, slots %+v; want only slot 1, to d", p.Counter, p.SlotCounters)
	}
}

// Lowering the limit revokes nobody: holders at or above it keep their
// slot with WithinLimit False (OverLimit), and nobody is granted until
// fewer grants hold than the new limit.
func TestPermitsShrinkKeepsHoldersAndGrantsNobody(t *testing.T) {
	a := heldIn(withPermits(grant("a", 0.1, 60), 3), 0, 8, 60)
	b := heldIn(withPermits(grant("b", 0.2, 60), 3), 1, 1, 60)
	c := heldIn(withPermits(grant("c", 0.3, 60), 3), 2, 41, 60)
	d := withPermits(grant("d", 0.4, 60), 1)
	slots := map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, 1, &b), 2: slotCounter(2, 41, &c)}
	f := Facts{Now: sec(2), Resource: res, Counter: counter(8, &a), Grants: []lockingv1alpha1.LockGrant{a, b, c, d}, SlotCounters: slots}
	p := Decide(f)
	if len(p.Granted) != 0 || p.Counter != nil || len(p.SlotCounters) != 0 {
		t.Fatalf("granted %v, counters %+v %+v; want nobody while 3 hold and the limit is 1", grantedNames(p), p.Counter, p.SlotCounters)
	}
	for name, over := range map[string]bool{"a": false, "b": true, "c": true} {
		s := statusOf(p, name)
		if !over {
			if s != nil {
				t.Fatalf("%s within the limit was rewritten: %+v", name, s)
			}
			continue
		}
		cond := meta.FindStatusCondition(s.Conditions, lockingv1alpha1.ConditionWithinLimit)
		if s.Phase != lockingv1alpha1.PhaseHeld || cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != lockingv1alpha1.LockGrantReasonOverLimit {
			t.Fatalf("%s: phase %s, WithinLimit %+v; want Held and OverLimit", name, s.Phase, cond)
		}
	}

	// a releases: two still hold, more than the limit of 1: still nobody.
	a.Spec.Release = true
	p = Decide(Facts{Now: sec(3), Resource: res, Counter: counter(8, &a), Grants: []lockingv1alpha1.LockGrant{a, b, c, d}, SlotCounters: slots})
	if len(p.Granted) != 0 || p.Counter == nil || p.Counter.Holder != nil {
		t.Fatalf("granted %v, slot 0 %+v; want slot 0 freed and nobody granted", grantedNames(p), p.Counter)
	}
	// b and c end: d gets slot 0, the only one below the limit.
	a.Status.Phase, b.Status.Phase, c.Status.Phase = lockingv1alpha1.PhaseReleased, lockingv1alpha1.PhaseExpired, lockingv1alpha1.PhaseReleased
	p = Decide(Facts{Now: sec(4), Resource: res, Counter: counter(8, nil), Grants: []lockingv1alpha1.LockGrant{a, b, c, d}, SlotCounters: slots})
	if s := statusOf(p, "d"); len(p.Granted) != 1 || s == nil || s.FenceToken != 9 || s.Permit != nil || s.FencedResource != "" {
		t.Fatalf("granted %v, d %+v; want d with fence 9 in slot 0, with the status of an exclusive lock", grantedNames(p), s)
	}
}

// Growing the limit lets waiters in at once, in new slots.
func TestPermitsGrowGrantsNewSlots(t *testing.T) {
	// Two permits asked while an exclusive grant holds: nobody joins the
	// exclusive holder, which asked to hold the resource alone.
	a := held(grant("a", 0.1, 60), 3, 60)
	b := withPermits(grant("b", 0.2, 60), 2)
	c := withPermits(grant("c", 0.3, 60), 2)
	p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(3, &a), Grants: []lockingv1alpha1.LockGrant{a, b, c}})
	if got := grantedNames(p); len(got) != 0 {
		t.Fatalf("granted %v beside the exclusive holder", got)
	}
	if s := statusOf(p, "a"); s != nil {
		t.Fatalf("the exclusive holder's status changed: %+v", s)
	}
	// Once it has left, the new limit takes effect: both are granted, in
	// slots 0 and 1, each with its slot's next fence.
	a.Spec.Release = true
	p = Decide(Facts{Now: sec(2), Resource: res, Counter: counter(3, &a), Grants: []lockingv1alpha1.LockGrant{a, b, c}})
	if got := grantedNames(p); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Fatalf("granted %v after the exclusive holder released, want b and c", got)
	}
	if p.Counter == nil || p.Counter.Fence != 4 || p.SlotCounters[1] == nil || p.SlotCounters[1].Fence != 1 {
		t.Fatalf("counters %+v and %+v, want slot 0 at fence 4 and slot 1 at fence 1", p.Counter, p.SlotCounters)
	}

	// Holders that asked for two permits are joined by at most one more,
	// even when a newer request raises the limit to three.
	h0 := heldIn(withPermits(grant("h0", 0.1, 60), 2), 0, 1, 60)
	d := withPermits(grant("d", 0.2, 60), 3)
	e := withPermits(grant("e", 0.3, 60), 3)
	p = Decide(Facts{Now: sec(1), Resource: res, Counter: counter(1, &h0), Grants: []lockingv1alpha1.LockGrant{h0, d, e}})
	if got := grantedNames(p); len(got) != 1 || got[0] != "d" {
		t.Fatalf("granted %v beside a holder of two permits, want d alone", got)
	}
}

// Strict FIFO: when the head cannot be granted (its slot waits out a
// lock-delay), nobody behind it is, even though a slot is free.
func TestPermitsNoBargingPastTheHead(t *testing.T) {
	a := heldIn(withPermits(grant("a", 0.1, 60), 2), 0, 1, 60)
	gone := heldIn(withPermits(grant("gone", 0.2, 1), 2), 1, 5, 1)
	gone.Spec.LockDelaySeconds = 10
	b := withPermits(grant("b", 0.3, 60), 2)
	c := withPermits(grant("c", 0.4, 60), 2)
	slots := map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, 5, &gone)}
	slots[1].Spec.Holder.LockDelaySeconds = 10
	p := Decide(Facts{Now: sec(2), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, gone, b, c}, SlotCounters: slots})
	if len(p.Granted) != 0 {
		t.Fatalf("granted %v during slot 1's lock-delay", grantedNames(p))
	}
	if s := statusOf(p, "b"); s == nil || meta.FindStatusCondition(s.Conditions, lockingv1alpha1.ConditionReady).Reason != lockingv1alpha1.LockGrantReasonLockDelay {
		t.Fatalf("b: %+v, want the head waiting out the lock-delay", s)
	}
	if c := p.SlotCounters[1]; c == nil || c.Holder != nil || c.LockDelayUntil == "" {
		t.Fatalf("slot 1 counter = %+v, want freed with its lock-delay", c)
	}
}

// Two deciders that raced granted one waiter two slots: the slot its
// status does not name is freed, with its fence kept, and given to the
// next waiter with a higher fence (at once: the waiter asked for no
// lock-delay; TestLockDelayOnEveryWayASlotIsFreed has one that did).
func TestPermitsDoublyGrantedSlotIsFreed(t *testing.T) {
	w := heldIn(withPermits(grant("w", 0.1, 60), 3), 1, 4, 60)
	x := withPermits(grant("x", 0.2, 60), 3)
	slots := map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, 4, &w), 2: slotCounter(2, 9, &w)}
	f := Facts{Now: sec(1), Resource: res, Counter: counter(2, nil), Grants: []lockingv1alpha1.LockGrant{w, x}, SlotCounters: slots}
	p := Decide(f)
	if s := statusOf(p, "x"); s == nil || *s.Permit != 0 || s.FenceToken != 3 {
		t.Fatalf("x: %+v, want slot 0 with fence 3", s)
	}
	if c := p.SlotCounters[2]; c == nil || c.Holder != nil || c.Fence != 9 || c.LockDelayUntil != "" {
		t.Fatalf("slot 2 counter = %+v, want freed at fence 9, without a lock-delay", c)
	}
	if s := statusOf(p, "w"); s != nil {
		t.Fatalf("w's status changed: %+v", s)
	}
	// Before either status was written: the waiter converges on the lowest
	// slot naming it, with that slot's fence; the other is freed.
	w = withPermits(grant("w", 0.1, 60), 3)
	slots = map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, 4, &w), 2: slotCounter(2, 9, &w)}
	p = Decide(Facts{Now: sec(1), Resource: res, Counter: counter(2, nil), Grants: []lockingv1alpha1.LockGrant{w}, SlotCounters: slots})
	if s := statusOf(p, "w"); s == nil || s.Phase != lockingv1alpha1.PhaseHeld || *s.Permit != 1 || s.FenceToken != 4 {
		t.Fatalf("w: %+v, want Held in slot 1 with fence 4", s)
	}
	if c := p.SlotCounters[2]; c == nil || c.Holder != nil || c.Fence != 9 {
		t.Fatalf("slot 2 counter = %+v, want freed at fence 9", c)
	}
	if p.SlotCounters[1] != nil {
		t.Fatalf("slot 1 rewritten: %+v", p.SlotCounters[1])
	}
}

// Expiry of a slot's holder hands that slot over; fences per slot only
// grow, over many passes with holders coming and going, and never more
// grants hold than the limit.
func TestPermitsPerSlotFencesIncreaseOverManyPasses(t *testing.T) {
	const n = 4
	var grants []lockingv1alpha1.LockGrant
	for i := range 12 {
		grants = append(grants, withPermits(grant(string(rune('a'+i)), 0.1*float64(i+1), 2), n))
	}
	f := Facts{Resource: res}
	last := map[int32]int64{}
	for step := range 40 {
		f.Now = sec(1 + float64(step)*0.7)
		f.Grants = grants
		p := Decide(f)
		f = applied(f, p)
		byUID := map[string]*lockingv1alpha1.LockGrant{}
		for _, g := range p.Statuses {
			byUID[string(g.UID)] = g
		}
		live := 0
		for i := range grants {
			if g := byUID[string(grants[i].UID)]; g != nil {
				grants[i] = *g
			}
			if grants[i].Status.Phase == lockingv1alpha1.PhaseHeld {
				live++
			}
		}
		if live > n {
			t.Fatalf("step %d: %d grants Held, limit %d", step, live, n)
		}
		for _, g := range p.Granted {
			k := g.HeldSlot()
			if g.Status.FenceToken <= last[k] {
				t.Fatalf("step %d: slot %d fence %d after %d", step, k, g.Status.FenceToken, last[k])
			}
			last[k] = g.Status.FenceToken
		}
	}
	if len(last) != n {
		t.Fatalf("slots used: %v, want all %d", last, n)
	}
}

// A request is granted only a slot below its own permits, and only while
// no more grants hold than it asked for: an exclusive request at the head,
// behind a newer request that raised the limit, waits until it can hold the
// resource alone (and nobody behind it barges into the free slot 2); then
// it holds slot 0 with the resource's next fence, and the request behind it
// waits for it in turn.
func TestPermitsRequestHoldsOnlyItsOwnSlots(t *testing.T) {
	a := heldIn(withPermits(grant("a", 0.1, 60), 2), 0, 7, 60)
	b := heldIn(withPermits(grant("b", 0.2, 60), 2), 1, 3, 60)
	e := grant("e", 0.3, 60)
	s := withPermits(grant("s", 0.4, 60), 3)
	slots := map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, 3, &b)}
	f := Facts{Now: sec(1), Resource: res, Counter: counter(7, &a), Grants: []lockingv1alpha1.LockGrant{a, b, e, s}, SlotCounters: slots}
	p := Decide(f)
	if len(p.Granted) != 0 || len(p.SlotCounters) != 0 {
		t.Fatalf("granted %v, slots %+v; want nobody while slot 0, the exclusive head's only slot, is held", grantedNames(p), p.SlotCounters)
	}

	a.Spec.Release = true
	p = Decide(Facts{Now: sec(2), Resource: res, Counter: counter(7, &a), Grants: []lockingv1alpha1.LockGrant{a, b, e, s}, SlotCounters: slots})
	if got := grantedNames(p); len(got) != 0 {
		t.Fatalf("granted %v while b holds; want the exclusive head to wait until it can hold alone", got)
	}

	b.Spec.Release = true
	p = Decide(Facts{Now: sec(3), Resource: res, Counter: counter(7, nil), Grants: []lockingv1alpha1.LockGrant{b, e, s}, SlotCounters: slots})
	if got := grantedNames(p); len(got) != 1 || got[0] != "e" {
		t.Fatalf("granted %v, want e alone", got)
	}
	if st := statusOf(p, "e"); st.Permit != nil || st.FencedResource != "" || st.FenceToken != 8 {
		t.Fatalf("e: %+v, want slot 0 with the resource's next fence 8, with the status of an exclusive lock", st)
	}
}
