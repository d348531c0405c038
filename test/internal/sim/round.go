package sim

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// Round plays one round with the given faults, or, when faults is nil, a
// random mix of one to four kinds chosen by the seed (one mixed round in
// eight plays them on a resource with permits, FaultSemaphore). It is deterministic:
// the same seed and faults give the same report.
func Round(seed uint64, faults []Fault) *Report { return round(seed, faults, forgetNone) }

// round is Round with a controller that forgets lock-delays on slots the way
// forget says, when the round plays a resource with permits (tests only).
func round(seed uint64, faults []Fault, forget forgetting) *Report {
	w, faults := roundWorld(seed, faults)
	if slices.Contains(faults, FaultSemaphore) {
		sw := newSemWorld(seed, faults)
		sw.forget = forget
		return sw.run()
	}
	return w.run()
}

// roundWorld makes the world of the round with seed, and its faults (a
// mixed schedule's when faults is nil). A round with FaultSemaphore is
// played by a semaphore world of its own instead.
func roundWorld(seed uint64, faults []Fault) (*world, []Fault) {
	w := newWorld(seed, nil)
	mixed := faults == nil
	if mixed {
		n := 1 + w.rng.IntN(4)
		perm := w.rng.Perm(len(Faults))
		for _, i := range perm[:n] {
			faults = append(faults, Faults[i])
		}
		if replicaRound(seed) {
			faults = append(faults, FaultReplicas)
		}
	}
	if mixed && semaphoreRound(seed) {
		faults = append(faults, FaultSemaphore)
	}
	for _, f := range faults {
		w.fault[f] = true
	}
	return w, faults
}

// RoundSeed is the seed of round i of a run with master seed master.
func RoundSeed(master uint64, i int) uint64 {
	// SplitMix64 of master+i: well-spread, reproducible seeds.
	z := master + uint64(i)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Run plays rounds 0..n-1 of a mixed schedule with master seed master on
// parallel goroutines (0: one per CPU) and merges their reports. The seeds of
// rounds with violations are listed in the report's violations.
func Run(master uint64, n, parallel int) *Report {
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	// Each goroutine takes the next round number and merges its rounds
	// into a report of its own; the reports are merged at the end.
	var next atomic.Int64
	reports := make([]*Report, parallel)
	var wg sync.WaitGroup
	for g := range parallel {
		reports[g] = newReport()
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				reports[g].Add(Round(RoundSeed(master, i), nil))
			}
		})
	}
	wg.Wait()
	total := newReport()
	for _, r := range reports {
		total.Add(r)
	}
	return total
}
