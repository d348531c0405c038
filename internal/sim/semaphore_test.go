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
