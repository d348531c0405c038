package sim

import "testing"

// Two replicas deciding at once, each at its own skewed clock, with every
// other fault kind beside them: nothing forbidden, and the replicas really
// raced (some passes lost a compare-and-swap or a status precondition).
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
	if total.Faults[string(FaultReplicas)] == 0 || total.Faults["replica-conflict"] == 0 {
		t.Fatalf("the replicas never raced: %v", total.Faults)
	}
}
