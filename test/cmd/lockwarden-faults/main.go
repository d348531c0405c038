// Command lockwarden-faults runs the deterministic fault simulation
// (test/internal/sim): by default 100,000 rounds of mixed fault schedules, then a
// one-line summary of every count the release gate requires to be zero. A
// failing round's seed is printed; -replay SEED plays it again exactly.
//
//	go -C test run ./cmd/lockwarden-faults                  # the full gate (make faults)
//	go -C test run ./cmd/lockwarden-faults -rounds 2000     # a quick run
//	go -C test run ./cmd/lockwarden-faults -replay 1234567  # one round, again
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/lockwarden/lockwarden/test/internal/sim"
)

// gcPercent is the collector's target unless GOGC says otherwise: the
// heap may grow to nine times what is live (about 150 MB on two CPUs).
const gcPercent = 800

func main() { os.Exit(run()) }

func run() int {
	rounds := flag.Int("rounds", 100000, "Rounds of mixed fault schedules to run.")
	seed := flag.Uint64("seed", 20260719, "Master seed; round i plays seed sim.RoundSeed(master, i).")
	parallel := flag.Int("parallel", 0, "Rounds run at once (0: one per CPU).")
	replay := flag.Uint64("replay", 0, "Play only the round with this seed (a mixed schedule), and print its report.")
	faults := flag.String("faults", "", "With -replay: the comma-separated fault kinds the round was played with, if not a mixed schedule.")
	cpuprofile := flag.String("cpuprofile", "", "Write a CPU profile of the run to this file (go tool pprof).")
	memprofile := flag.String("memprofile", "", "Write an allocation profile of the run to this file (go tool pprof).")
	flag.Parse()

	if os.Getenv("GOGC") == "" {
		// A round's live heap is small and short-lived, and at the
		// default the collector ran about as much as the rounds did.
		debug.SetGCPercent(gcPercent)
	}
	if *parallel <= 0 {
		*parallel = runtime.GOMAXPROCS(0)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" {
		defer func() {
			f, err := os.Create(*memprofile)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}()
	}
	start := time.Now()
	var r *sim.Report
	if *replay != 0 {
		var kinds []sim.Fault
		for _, f := range strings.Split(*faults, ",") {
			if f != "" {
				kinds = append(kinds, sim.Fault(f))
			}
		}
		r = sim.Round(*replay, kinds)
		*parallel = 1
	} else {
		r = sim.Run(*seed, *rounds, *parallel)
	}
	fmt.Println(r.Summary())
	fmt.Printf("faults injected: %s\n", counts(r.Faults))
	fmt.Printf("refusals: %s\n", counts(r.Rejected))
	took := time.Since(start)
	fmt.Printf("took %s wall, %d rounds at once on %d CPUs, %.1f rounds/s\n",
		took.Round(time.Millisecond), *parallel, runtime.NumCPU(), float64(r.Rounds)/took.Seconds())
	if r.Forbidden() != 0 {
		for _, v := range r.Violations {
			fmt.Println("violation:", v)
		}
		fmt.Println("FAIL: replay a round with -replay SEED")
		return 1
	}
	fmt.Println("PASS: every forbidden count is 0 and every accepted mutation passed the proof and fence checks")
	return 0
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}
