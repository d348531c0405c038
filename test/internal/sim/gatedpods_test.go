package sim

import (
	"testing"
)

// Lock-gated Pods alone, over a few rounds: each of their faults is met,
// the late writes of Pods that lost their lock are refused, and nothing
// forbidden happens.
func TestGatedPodRounds(t *testing.T) {
	total := newReport()
	for i := range 60 {
		total.Add(Round(RoundSeed(0x6a7ed, i), []Fault{FaultGatedPod}))
	}
	t.Log(total.Summary())
	if total.Forbidden() != 0 {
		t.Fatalf("%s", total)
	}
	for _, f := range []string{string(FaultGatedPod), "gate-removal-lost", "gated-pod-deleted-while-waiting", "gated-pod-deleted-while-running",
		"gated-pod-kubelet-lost", "gated-pod-ended-LockLost"} {
		if total.Faults[f] == 0 {
			t.Errorf("%s never happened (faults: %v)", f, total.Faults)
		}
	}
	if total.Rejected["STALE_OWNER"]+total.Rejected["EXPIRED"] == 0 {
		t.Errorf("no late write of a Pod that lost its lock was refused (rejections: %v)", total.Rejected)
	}
}

// A manager that starts Pods before their grant is Held, renews the grants
// of Pods on lost nodes, or never gives a lock back is caught.
func TestGatedPodOracleCatchesABrokenManager(t *testing.T) {
	for _, b := range []struct {
		name   string
		broken podBreak
	}{{"starts ungranted", podStartsUngranted}, {"renews blind", podRenewsBlind}, {"never releases", podNeverReleases}} {
		t.Run(b.name, func(t *testing.T) {
			total := newReport()
			for i := range 40 {
				w := newWorld(RoundSeed(0x6a7ed, i), []Fault{FaultGatedPod})
				w.gated = &gatedPods{broken: b.broken}
				total.Add(w.run())
			}
			if total.PodGateBroken == 0 {
				t.Fatalf("the oracle did not notice: %s", total)
			}
		})
	}
}
