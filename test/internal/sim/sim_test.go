package sim

import (
	"fmt"
	"reflect"
	"testing"
)

// gateRounds is the size of the mixed run in make test; make faults runs
// 100,000 (cmd/lockwarden-faults).
const gateRounds = 2000

// TestGate runs a mixed schedule of every fault and requires every forbidden
// count to be zero and every accepted mutation to have passed the checks.
func TestGate(t *testing.T) {
	r := Run(20260719, gateRounds, 0)
	t.Log(r.Summary())
	t.Logf("%s=%d write-in-flight-at-release=%d replica-freeze=%d", admissionLagFault, r.Faults[admissionLagFault],
		r.Faults["write-in-flight-at-release"], r.Faults["replica-freeze"])
	if r.Forbidden() != 0 {
		t.Fatalf("the release gate failed:\n%s\nreplay a round with: go -C test run ./cmd/lockwarden-faults -replay SEED (from the repository root)", r)
	}
	if r.Accepted == 0 || r.CheckedShare() != 100 {
		t.Fatalf("accepted %d, checked %.1f%%", r.Accepted, r.CheckedShare())
	}
	for _, f := range Faults {
		if r.Faults[string(f)] == 0 {
			t.Errorf("fault %s was never injected in %d rounds", f, gateRounds)
		}
	}
	if r.Faults[admissionLagFault] == 0 {
		t.Errorf("no write was accepted in a replica's admission lag in %d rounds", gateRounds)
	}
}

// Each fault kind alone, over a few rounds: it is injected, the resource
// refuses what it must (the reasons listed), and nothing forbidden happens.
func TestEachFault(t *testing.T) {
	expect := map[Fault][]string{
		FaultPause:            {"STALE_OWNER", "EXPIRED"},
		FaultLostRenew:        nil,
		FaultReleaseReacquire: nil,
		FaultSegmentDisorder:  {"SEQUENCE_GAP"},
		FaultLateMessage:      {"STALE_OWNER", "EXPIRED"},
		FaultRestore:          {"FENCE_REGRESSION"},
		FaultLostAck:          nil,
		FaultForgedFence:      {"BINDING_MISMATCH", "BAD_SIGNATURE"},
		FaultTamperedRecord:   {"BAD_SIGNATURE"},
		FaultReplay:           {"BINDING_MISMATCH", "NOT_OWNER"},
		FaultRevokedEpoch:     {"REVOKED_EPOCH", "REVOKED"},
		FaultControllerCrash:  nil,
		FaultSharedIdentity:   {"NO_FENCE", "STALE_OWNER"},
		FaultUnasserted:       {"NO_FENCE"},
		FaultLookalike:        nil,
		FaultSubresource:      {"NO_FENCE"},
		FaultDelete:           {"NO_FENCE"},
	}
	// Outcomes a fault kind must also show: what the holder must still be
	// able to do.
	must := map[Fault]string{
		FaultLostAck:   "mutation-unknown-applied",
		FaultLookalike: "lookalike-guarded-by-holder",
		FaultDelete:    "guarded-delete-accepted",
	}
	for _, f := range Faults {
		t.Run(string(f), func(t *testing.T) {
			total := newReport()
			for i := range 40 {
				total.Add(Round(RoundSeed(uint64(len(f)), i), []Fault{f}))
			}
			if total.Forbidden() != 0 {
				t.Fatalf("%s", total)
			}
			if total.Faults[string(f)] == 0 {
				t.Fatalf("%s was never injected", f)
			}
			if want := expect[f]; len(want) > 0 {
				n := 0
				for _, reason := range want {
					n += total.Rejected[reason]
				}
				if n == 0 {
					t.Errorf("no mutation was refused %v under %s (rejections: %v)", want, f, total.Rejected)
				}
			}
			if f == FaultSegmentDisorder && total.Rejected["SEGMENT_CONFLICT"] == 0 {
				t.Errorf("no resend with another payload was quarantined")
			}
			if want := must[f]; want != "" && total.Faults[want] == 0 {
				t.Errorf("never happened under %s: %s (faults: %v)", f, want, total.Faults)
			}
		})
	}
}

// A round is a function of its seed.
func TestReplayIsExact(t *testing.T) {
	for i := range 5 {
		seed := RoundSeed(7, i)
		a, b := Round(seed, nil), Round(seed, nil)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d played twice differs:\n%s\n%s", seed, a.Summary(), b.Summary())
		}
	}
}

// The oracle is independent of the verifier: an enforcement point that
// accepts everything is caught.
func TestOracleCatchesABrokenEnforcementPoint(t *testing.T) {
	total := newReport()
	for i := range 20 {
		w := newWorld(RoundSeed(99, i), []Fault{FaultPause, FaultForgedFence, FaultReplay, FaultSubresource, FaultDelete})
		w.broken = brokenAcceptAll
		total.Add(w.run())
	}
	if total.StaleAccepted == 0 || total.ForgedAccepted == 0 || total.Accepted == total.AcceptedChecked {
		t.Fatalf("a broken enforcement point went unnoticed: %s", total.Summary())
	}
}

// An enforcement point that takes a claim the stored object carried as
// asserted, and leaves the claim on the object (a guard that reads the stored state as the write's claim),
// is caught once replicas share one identity: a superseded replica's merge
// patch or re-read update rides on the holder's claim. With an identity per
// worker the same guard is refused NOT_OWNER, which is why only the shared
// identity shows it.
func TestOracleCatchesTrustedInheritedClaims(t *testing.T) {
	play := func(faults ...Fault) *Report {
		total := newReport()
		for i := range 100 {
			w := newWorld(RoundSeed(10, i), faults)
			w.broken = brokenTrustInherited
			total.Add(w.run())
		}
		return total
	}
	r := play(FaultSharedIdentity, FaultUnasserted)
	t.Log(r.Summary())
	if r.StaleAccepted == 0 {
		t.Fatalf("a guard that trusts inherited claims went unnoticed with replicas sharing an identity: %s", r.Summary())
	}
	if r := play(FaultUnasserted); r.StaleAccepted != 0 {
		t.Fatalf("with an identity per worker, an inherited claim was accepted from a non-holder: %s", r)
	}
}

// An enforcement point that takes the record of an object that was not
// guarded as its own is caught: a look-alike's forged record locks the real
// holder out.
func TestOracleCatchesTrustedForgedRecords(t *testing.T) {
	total := newReport()
	for i := range 40 {
		w := newWorld(RoundSeed(11, i), []Fault{FaultLookalike})
		w.broken = brokenTrustRecord
		total.Add(w.run())
	}
	t.Log(total.Summary())
	if total.HolderLockedOut == 0 {
		t.Fatalf("a guard that trusts a forged record went unnoticed: %s", total.Summary())
	}
}

func ExampleRound() {
	r := Round(42, []Fault{FaultPause})
	fmt.Println(r.Forbidden(), r.CheckedShare())
	// Output: 0 100
}

// The waiter checks are not vacuous: a controller that never judges a
// session lapsed (it counts every session as just renewed) grants killed
// waiters, and the oracle says so.
func TestOracleCatchesAControllerThatIgnoresSessions(t *testing.T) {
	total := newReport()
	for i := range 20 {
		w := newWorld(RoundSeed(7, i), []Fault{FaultKilledWaiter})
		w.reg.sessionsNeverLapse = true
		total.Add(w.run())
	}
	if total.DeadWaiterGranted == 0 {
		t.Fatalf("a controller that ignores sessions went unnoticed: %s", total.Summary())
	}
}

// Lock-delay is judged, and the judgment is not vacuous: a controller that
// stores counters without the delay grants during it, and the oracle says so.
func TestOracleCatchesAControllerThatForgetsLockDelay(t *testing.T) {
	for _, broken := range []bool{false, true} {
		total := newReport()
		for i := range 60 {
			w := newWorld(RoundSeed(17, i), []Fault{FaultLockDelay, FaultPause})
			w.reg.dropLockDelay = broken
			total.Add(w.run())
		}
		t.Log(broken, total.Summary())
		if broken && total.LockDelayBroken == 0 {
			t.Fatalf("a controller that forgets lock-delays went unnoticed: %s", total.Summary())
		}
		if !broken && total.Forbidden() != 0 {
			t.Fatalf("with lock-delays: %s\n%v", total.Summary(), total.Violations)
		}
	}
}
