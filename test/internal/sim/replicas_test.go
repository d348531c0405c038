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
	for _, k := range []string{string(FaultReplicas), "replica-conflict", "replica-deferral", "replica-takeover", "replica-freeze", "replica-thawed-write"} {
		if total.Faults[k] == 0 {
			t.Fatalf("no %s in any round: %v", k, total.Faults)
		}
	}
}
