package sim

import "testing"

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

// regressionDoubledSlot is a mixed round the release gate once failed: a
// second decider, acting on an older read, granted a waiter that asked for
// a lock-delay a second slot; the next pass freed that slot and, without
// the waiter's lock-delay, granted it to the next waiter 0.8 s too early.
const regressionDoubledSlot = 2498358110938382994

// A slot freed from a waiter two racing deciders granted two slots waits
// out the waiter's lock-delay.
func TestSemaphoreDoublyGrantedSlotKeepsItsLockDelay(t *testing.T) {
	r := Round(regressionDoubledSlot, nil)
	t.Log(r.Summary(), r.Faults)
	if r.Forbidden() != 0 {
		t.Fatalf("%s", r)
	}
	for _, f := range []string{string(FaultSemaphore), "semaphore-stale-decider", "semaphore-double-grant", "semaphore-double-grant-freed"} {
		if r.Faults[f] == 0 {
			t.Fatalf("the round no longer plays %s (faults: %v)", f, r.Faults)
		}
	}
}

// Lock-delay on slots is judged, and not vacuously: a controller that
// forgets it on every slot, or only on a slot freed from a waiter granted
// two, grants during it, and the oracle says so.
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
	if r := round(regressionDoubledSlot, nil, forgetDoubled); r.LockDelayBroken == 0 {
		t.Fatalf("a controller that frees a doubly granted slot without its lock-delay went unnoticed: %s", r.Summary())
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
