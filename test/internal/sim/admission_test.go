package sim

import "testing"

// Cached admission is played, and its window is exercised: with two
// replicas, a write answered from a replica's cache that still names an
// ended grant is accepted and counted as accepted-in-admission-lag, and
// nothing forbidden happens (a write after the lease end the cache
// recorded, below the object's recorded fence, or a successor refused).
func TestCachedAdmissionLag(t *testing.T) {
	total := newReport()
	for i := range 60 {
		total.Add(Round(RoundSeed(23, i), []Fault{FaultReplicas, FaultPause, FaultLateMessage, FaultSharedIdentity}))
	}
	t.Log(total.Summary(), " ", admissionLagFault, "=", total.Faults[admissionLagFault])
	if total.Forbidden() != 0 {
		t.Fatalf("%s", total)
	}
	if total.Faults[admissionLagFault] == 0 {
		t.Fatalf("no write was accepted in a replica's admission lag: %v", total.Faults)
	}
}

// The direct read before a refusal is not vacuous: an enforcement point
// that refuses on a replica's cached counter refuses successors whose
// grant the cache does not show yet, and the oracle says so.
func TestOracleCatchesARefusalOnTheCache(t *testing.T) {
	total := newReport()
	for i := range 40 {
		w := newWorld(RoundSeed(24, i), []Fault{FaultReplicas, FaultPause})
		w.broken = brokenRefuseFromCache
		total.Add(w.run())
	}
	t.Log(total.Summary())
	if total.SuccessorRefused == 0 {
		t.Fatalf("a guard that refuses on its cache went unnoticed: %s", total.Summary())
	}
}
