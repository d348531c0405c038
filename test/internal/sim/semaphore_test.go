package sim

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Rounds on a resource with permits, alone and with the faults that apply
// to them: every slot stays exclusive and fenced, nobody barges, never more
// holders than permits, and the limit shrinks and grows.
func TestSemaphoreRounds(t *testing.T) {
	for _, extra := range [][]Fault{nil, {FaultPause}, {FaultReplicas}, {FaultControllerCrash, FaultLockDelay}, {FaultReplicas, FaultPause, FaultControllerCrash}} {
		total := newReport()
		for i := range 20 {
			total.Add(Round(RoundSeed(31, i), append([]Fault{FaultSemaphore}, extra...)))
		}
		if total.Forbidden() != 0 {
			t.Fatalf("with %v: %s", extra, total)
		}
		if total.Accepted == 0 || total.Rejected["BINDING_MISMATCH"] == 0 {
			t.Fatalf("with %v: accepted %d, refusals %v; want writes accepted and misrouted ones refused BINDING_MISMATCH", extra, total.Accepted, total.Rejected)
		}
		for _, f := range []string{"semaphore-shrink", "semaphore-grow"} {
			if total.Faults[f] == 0 {
				t.Errorf("with %v: %s never happened (faults: %v)", extra, f, total.Faults)
			}
		}
		if len(extra) > 0 && extra[0] == FaultPause && total.Rejected["STALE_OWNER"]+total.Rejected["EXPIRED"] == 0 {
			t.Errorf("no late write was refused: %v", total.Rejected)
		}
		t.Logf("with %v: %s; faults %v; refusals %v", extra, total.Summary(), total.Faults, total.Rejected)
	}
}

// A mixed schedule plays resources with permits in some of its rounds.
func TestMixedScheduleHasSemaphoreRounds(t *testing.T) {
	r := Run(20260719, 400, 0)
	if r.Faults[string(FaultSemaphore)] == 0 {
		t.Fatalf("no semaphore round in 400 mixed rounds: %v", r.Faults)
	}
	if r.Forbidden() != 0 {
		t.Fatalf("%s", r)
	}
}

// doubledSlot is what playDoubledSlot saw of the slot it freed.
type doubledSlot struct {
	w *semWorld
	// delayEnds is when the waiter's lock-delay on the freed slot ends:
	// its lock-delay after the pass that freed the slot.
	delayEnds time.Duration
	// grantedAt is when the next waiter was granted the slot (the pass
	// whose status write made it Held); -1 if it never was.
	grantedAt time.Duration
}

// playDoubledSlot plays, pass by pass on the controller's own decision and
// write path (grantplan.Decide, then compare-and-swap counter writes, then
// status writes), a waiter that two racing deciders grant two slots, and
// what happens to the slot it holds by mistake. With permits 2:
//
//   - 0 s: a (lease 10 s) and b (lease 1 s) are granted slots 0 and 1;
//     the waiter w (lease 10 s, lock-delay 1 s) waits.
//   - 0.9 s: a second decider, a manager replica, reads the grants and the
//     counters.
//   - 0.95 s: a releases; the first decider frees slot 0 and grants it to w.
//   - 1.05 s: the second decider decides on its read of 0.9 s: b's lease
//     is over and a still holds slot 0 as it read them, so it grants w
//     slot 1. Slot 1's counter has not changed since its read: its
//     compare-and-swap lands and both counters name w. Its status write
//     for w fails (w changed since), so w's status names slot 0.
//   - 1.1 s: the first decider frees slot 1, which names w beside the slot
//     w holds. w never released it, and its client may have seen the
//     second decider's grant of slot 1 and written there: the slot waits
//     out w's lock-delay, until 2.1 s.
//   - 1.2 s: x asks for a permit; the first decider runs every 100 ms
//     until x is granted or 3 s.
//
// Each step checks that the registry is as described, so the scenario
// fails loudly rather than testing nothing if the model changes under it.
// forget breaks the controller's counter writes (forgetLockDelay).
func playDoubledSlot(t *testing.T, forget forgetting) doubledSlot {
	t.Helper()
	w := newSemWorld(1, []Fault{FaultSemaphore, FaultReplicas, FaultLockDelay})
	w.forget = forget
	at := func(d time.Duration) {
		if d < w.s.now {
			t.Fatalf("the scenario goes back in time from %s to %s", w.s.now, d)
		}
		w.s.now = d
	}
	pass := func() { w.apply(w.gather(false)) }
	ask := func(owner string, lease, lockDelay int32) types.UID {
		return w.request(lockingv1alpha1.LockGrantSpec{Resource: w.resource, Owner: owner, Permits: 2,
			LeaseDurationSeconds: lease, LockDelaySeconds: lockDelay})
	}
	holds := func(uid types.UID, k int32) bool {
		g := w.grants[uid]
		return g.Status.Phase == lockingv1alpha1.PhaseHeld && g.HeldSlot() == k
	}
	state := func(uid types.UID) string {
		g := w.grants[uid]
		if g.Status.Phase == lockingv1alpha1.PhaseHeld {
			return fmt.Sprintf("%s holds slot %d", g.Spec.Owner, g.HeldSlot())
		}
		return fmt.Sprintf("%s is %q", g.Spec.Owner, g.Status.Phase)
	}
	holder := func(k int32) types.UID {
		if c := w.counters[lockingv1alpha1.SlotResource(w.resource, k)]; c != nil && c.Spec.Holder != nil {
			return types.UID(c.Spec.Holder.UID)
		}
		return ""
	}

	a, b, waiter := ask("a", 10, 0), ask("b", 1, 0), ask("w", 10, 1)
	pass()
	if !holds(a, 0) || !holds(b, 1) || w.grants[waiter].Status.Phase != lockingv1alpha1.PhasePending {
		t.Fatalf("at %s: want a holding slot 0, b slot 1 and w waiting; %s, %s, %s", w.s.now, state(a), state(b), state(waiter))
	}

	at(900 * time.Millisecond)
	pass()
	w.remember() // the second decider's read

	at(950 * time.Millisecond)
	if !w.release("a", w.grants[a]) {
		t.Fatalf("at %s: a could not release", w.s.now)
	}
	pass()
	if !holds(waiter, 0) || holder(1) != b {
		t.Fatalf("at %s: want w granted slot 0 and slot 1 still b's; %s, slot 1 names %q", w.s.now, state(waiter), holder(1))
	}

	at(1050 * time.Millisecond)
	read := w.pastGrants[0]
	listed := make([]*lockingv1alpha1.LockGrant, 0, len(read))
	for _, uid := range slices.SortedFunc(maps.Keys(read), compareUID) {
		listed = append(listed, read[uid])
	}
	w.apply(w.decide(listed, 0))
	if holder(0) != waiter || holder(1) != waiter || !holds(waiter, 0) || w.rep.Faults["semaphore-double-grant"] != 1 {
		t.Fatalf("at %s: want both counters naming w, whose status names slot 0; slots name %q and %q, %s, faults %v",
			w.s.now, holder(0), holder(1), state(waiter), w.rep.Faults)
	}

	at(1100 * time.Millisecond)
	pass()
	if holder(1) != "" || !holds(waiter, 0) || w.rep.Faults["semaphore-double-grant-freed"] != 1 {
		t.Fatalf("at %s: want slot 1 freed from w, which holds slot 0; slot 1 names %q, %s, faults %v",
			w.s.now, holder(1), state(waiter), w.rep.Faults)
	}
	ds := doubledSlot{w: w, delayEnds: w.s.now + time.Second, grantedAt: -1}

	at(1200 * time.Millisecond)
	next := ask("x", 2, 0)
	for ; w.s.now <= 3*time.Second; at(w.s.now + 100*time.Millisecond) {
		pass()
		if holds(next, 1) {
			ds.grantedAt = w.s.now
			break
		}
	}
	if ds.grantedAt < 0 || holder(1) != next {
		t.Fatalf("x was never granted slot 1: %s, slot 1 names %q", state(next), holder(1))
	}
	return ds
}

// A slot freed from a waiter that two racing deciders granted two slots
// (one acting on an older read) waits out the waiter's lock-delay before it
// is granted again: the waiter's client may have seen the second grant and
// written under it, and nothing tells the controller it did not. Once the
// delay is over, the slot is granted at the next pass.
func TestSemaphoreDoublyGrantedSlotKeepsItsLockDelay(t *testing.T) {
	ds := playDoubledSlot(t, forgetNone)
	r := ds.w.rep
	t.Logf("slot 1 granted again at %s, its lock-delay ending at %s; %s; faults %v", ds.grantedAt, ds.delayEnds, r.Summary(), r.Faults)
	if ds.grantedAt < ds.delayEnds {
		t.Fatalf("slot 1 was granted again at %s, before the lock-delay of the waiter granted it twice ended at %s", ds.grantedAt, ds.delayEnds)
	}
	if ds.grantedAt > ds.delayEnds+100*time.Millisecond {
		t.Fatalf("slot 1 was granted again only at %s, more than a pass after the lock-delay ended at %s", ds.grantedAt, ds.delayEnds)
	}
	if r.Forbidden() != 0 {
		t.Fatalf("%s", r)
	}
}

// Lock-delay on slots is judged, and not vacuously: a controller that
// forgets it on every slot, or only on a slot freed from a waiter granted
// two (the scenario of playDoubledSlot), grants during it, and the oracle
// says so.
func TestOracleCatchesAControllerThatForgetsLockDelayOnSlots(t *testing.T) {
	play := func(forget forgetting, faults []Fault, rounds int) *Report {
		total := newReport()
		for i := range rounds {
			total.Add(round(RoundSeed(23, i), faults, forget))
		}
		return total
	}
	faults := []Fault{FaultSemaphore, FaultLockDelay, FaultPause}
	if r := play(forgetNone, faults, 10); r.Forbidden() != 0 || r.Faults["lock-delay-ended-unreleased"] == 0 {
		t.Fatalf("with lock-delays on slots: %s\nfaults: %v", r, r.Faults)
	}
	if r := play(forgetAll, faults, 10); r.LockDelayBroken == 0 {
		t.Fatalf("a controller that forgets lock-delays on slots went unnoticed: %s", r.Summary())
	}
	ds := playDoubledSlot(t, forgetDoubled)
	if ds.grantedAt >= ds.delayEnds {
		t.Fatalf("the broken controller waited out the lock-delay anyway (granted at %s, delay ending at %s): the scenario tests nothing", ds.grantedAt, ds.delayEnds)
	}
	if r := ds.w.rep; r.LockDelayBroken != 1 {
		t.Fatalf("a controller that frees a doubly granted slot without its lock-delay, granting it again at %s before %s, went unnoticed: %s",
			ds.grantedAt, ds.delayEnds, r)
	}
}

// On a resource with permits too, the second decider, thawed after a
// freeze, decides on a grants cache that is behind (as it was when it
// froze) and on slot counters read fresh. It never swaps a slot's counter
// to a grant that had already ended when it read it, because it reads every
// grant it is about to grant directly first; and the check is not vacuous:
// a decider that grants on its cached copy makes such swaps, and the oracle
// says so.
func TestSemaphoreReplicaWithAStaleCacheGrantsNoEndedRequest(t *testing.T) {
	for _, trust := range []bool{false, true} {
		total := newReport()
		for i := range 20 {
			w := newSemWorld(RoundSeed(29, i), []Fault{FaultSemaphore, FaultReplicas})
			w.trustCache, w.freezeChance = trust, 10*semFreezeChance
			total.Add(w.run())
		}
		t.Logf("granting on the cache's copy: %v; %s; freezes %d, stale-cache passes %d, stale grant reads %d", trust, total.Summary(),
			total.Faults["semaphore-replica-freeze"], total.Faults["semaphore-stale-cache-pass"], total.Faults["semaphore-stale-grant-read"])
		if total.Faults["semaphore-stale-cache-pass"] == 0 {
			t.Fatalf("no pass decided on a stale cache: %v", total.Faults)
		}
		if trust && total.PhantomGrants == 0 {
			t.Fatalf("a decider granting slots on a stale cache went unnoticed: %s", total.Summary())
		}
		if !trust && (total.Forbidden() != 0 || total.Faults["semaphore-stale-grant-read"] == 0) {
			t.Fatalf("stale grant reads %d; %s", total.Faults["semaphore-stale-grant-read"], total)
		}
	}
}
