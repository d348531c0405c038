package sim

import "testing"

// Two replicas deciding at once, each at its own skewed clock, with every
// other fault kind beside them: nothing forbidden, and the replicas really
// raced (some passes lost a compare-and-swap or a status precondition).
// Each resource has a preferred replica; the other defers, and takes over
// when the preferred one is frozen (its Lease lapses, or the takeover delay
// passes with work left), and a frozen replica's plan lands when it thaws.
func TestReplicas(t *testing.T) {
	total := newReport()
	for i, f := range Faults {
		for j := range 8 {
			total.Add(Round(RoundSeed(uint64(1000+i), j), []Fault{FaultReplicas, f}))
		}
	}
	t.Log(total.Summary())
	if total.Forbidden() != 0 {
		t.Fatalf("%s", total)
	}
	for _, k := range []string{string(FaultReplicas), "replica-conflict", "replica-deferral", "replica-takeover", "replica-freeze", "replica-thawed-write", "replica-stale-cache-pass"} {
		if total.Faults[k] == 0 {
			t.Fatalf("no %s in any round: %v", k, total.Faults)
		}
	}
}

// A replica that thaws after a freeze decides on a grants cache that is
// behind (as it was when it froze) and on counters read fresh. It never
// swaps a counter to a grant that had already ended when it read it,
// because it reads every grant it is about to grant directly first; and
// the check is not vacuous: a replica that grants on its cached copy does
// make such swaps, and the oracle says so. Nor does it end a grant its
// cached copy shows Held while the counter names another on that copy
// alone: it reads it directly, and leaves a grant whose copy is out of
// date (its owner's release, another replica's status not cached yet) to
// a pass on the caught-up cache.
func TestReplicaWithAStaleCacheGrantsNoEndedRequest(t *testing.T) {
	for _, trust := range []bool{false, true} {
		total := newReport()
		for i := range 120 {
			w := newWorld(RoundSeed(23, i), []Fault{FaultReplicas, FaultKilledWaiter})
			w.reg.trustCache = trust
			total.Add(w.run())
		}
		t.Logf("granting on the cache's copy: %v; %s; stale-cache passes %d, stale grant reads %d, unnamed grants left to a caught-up cache %d", trust, total.Summary(),
			total.Faults["replica-stale-cache-pass"], total.Faults["replica-stale-grant-read"], total.Faults["replica-stale-unnamed-read"])
		if total.Faults["replica-stale-cache-pass"] == 0 {
			t.Fatalf("no pass decided on a stale cache: %v", total.Faults)
		}
		if trust && total.PhantomGrants == 0 {
			t.Fatalf("a replica granting on a stale cache went unnoticed: %s", total.Summary())
		}
		if !trust && total.Faults["replica-stale-unnamed-read"] == 0 {
			t.Fatalf("no pass found the cached copy of a grant it was about to end unnamed out of date: %v", total.Faults)
		}
		if !trust && total.Forbidden() != 0 {
			t.Fatalf("%s", total)
		}
	}
}

// A replica swaps a counter to the next holder and freezes before it
// writes the statuses of that handoff (the ended holder's Released, the
// new holder's Held). The other replica, its grants cache behind (it shows
// the ended holder still Pending), writes the new holder's Held status on
// the counter read directly. Unless it lists the resource's grants
// directly first, the ended holder's Held status is still stored: two
// unexpired Held grants of one resource (the gate's seed
// 1976539317540727533 on the tree before the direct list).
func TestReplicaWritesNoHeldStatusBesideAStoredHolder(t *testing.T) {
	const seed = 1976539317540727533
	for _, skip := range []bool{true, false} {
		w, _ := roundWorld(seed, nil)
		w.reg.skipDirectList = skip
		rep := w.run()
		t.Logf("without the direct list: %v; %s", skip, rep.Summary())
		if skip && rep.TwoHolders == 0 {
			t.Fatalf("the round no longer plays a second Held status without the direct list; pick a seed that does: %s", rep.Summary())
		}
		if !skip && rep.Forbidden() != 0 {
			t.Fatalf("%s", rep)
		}
	}
}

// Seeds of the gate that once made a replica swap a counter to a grant
// that had ended: a pass confirmed a grant on the copy it had read of the
// counter's old holder, then, deciding again on a fresher counter, granted
// the older cached copy of the same grant unread. A confirmation holds for
// the copy it was made on only.
func TestGateSeedsOfAConfirmationOnAnotherCopy(t *testing.T) {
	for _, seed := range []uint64{8303632508418424361, 17879472550667295451, 9516999969936210443, 4383444042009452936, 4381448704037697554} {
		if rep := Round(seed, nil); rep.Forbidden() != 0 {
			t.Errorf("seed %d: %s", seed, rep)
		}
	}
}
