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
	if r.Forbidden() != 0 {
		t.Fatalf("the release gate failed:\n%s\nreplay a round with: go run ./cmd/lockwarden-faults -replay SEED", r)
	}
	if r.Accepted == 0 || r.CheckedShare() != 100 {
		t.Fatalf("accepted %d, checked %.1f%%", r.Accepted, r.CheckedShare())
	}
	for _, f := range Faults {
		if r.Faults[string(f)] == 0 {
			t.Errorf("fault %s was never injected in %d rounds", f, gateRounds)
		}
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
			if f == FaultLostAck && total.Faults["mutation-unknown-applied"] == 0 {
				t.Errorf("no MUTATION_UNKNOWN was resolved by its receipt")
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
		w := newWorld(RoundSeed(99, i), []Fault{FaultPause, FaultForgedFence, FaultReplay})
		w.acceptAll = true
		total.Add(w.run())
	}
	if total.StaleAccepted == 0 || total.ForgedAccepted == 0 || total.Accepted == total.AcceptedChecked {
		t.Fatalf("a broken enforcement point went unnoticed: %s", total.Summary())
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
