package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// options are the bench's flags. Sizes left at zero take the default of the
// chosen mode (full or --quick).
type options struct {
	assets      string
	manager     string
	crds        string
	localConfig string
	out         string
	timeout     time.Duration
	quick       bool
	phases      string // comma-separated phase keys; empty: all
	replicas    []int  // manager replicas, all granting: the first for every phase, the others compared in the throughput phase

	handoffs        int           // handoffs per system (lockwarden, etcd mutex, Lease lock, leader election 1s)
	leDefaultRounds int           // handoffs of leader election at its defaults 15s/10s/2s
	tracedHandoffs  int           // lockwarden handoffs with the path breakdown
	expiryRounds    int           // expiry handoffs per system
	window          time.Duration // throughput window per system and width
	parallel        int           // resources of the parallel throughput run
	admission       int           // write pairs of the admission phase
	floors          int           // samples of each raw floor
	scale           int           // live grants of the scale phase
	grantsPerRes    int           // grants per resource in the scale phase
	probes          int           // request-to-Held probes at scale
	retention       time.Duration // --finished-grant-retention of the scale phase
	gcTimeout       time.Duration // how long to wait past the retention for the collection

	longQueue        int           // requests in line in the long-queue phase
	deadWaiterRounds int           // handoffs per k of the dead-waiter phase
	deadWaiterLead   time.Duration // how long before the release the dead waiters die
}

// defaults fills every size left unset from the full or the quick preset.
func (o *options) defaults() {
	type preset struct {
		handoffs, le, traced, expiry, parallel, admission, floors, scale, probes int
		window, retention, gc                                                    time.Duration
	}
	p := preset{300, 5, 60, 20, 64, 1000, 1000, 10000, 200, 10 * time.Second, 20 * time.Second, 4 * time.Minute}
	if o.quick {
		p = preset{50, 1, 10, 3, 64, 200, 300, 1000, 30, 2 * time.Second, 10 * time.Second, 2 * time.Minute}
	}
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	set(&o.handoffs, p.handoffs)
	set(&o.leDefaultRounds, p.le)
	set(&o.tracedHandoffs, p.traced)
	set(&o.expiryRounds, p.expiry)
	set(&o.parallel, p.parallel)
	set(&o.admission, p.admission)
	set(&o.floors, p.floors)
	set(&o.scale, p.scale)
	set(&o.grantsPerRes, 10)
	set(&o.longQueue, 200)
	set(&o.deadWaiterRounds, map[bool]int{false: 5, true: 2}[o.quick])
	setD(&o.deadWaiterLead, 5*time.Second)
	set(&o.probes, p.probes)
	setD(&o.window, p.window)
	setD(&o.retention, p.retention)
	setD(&o.gcTimeout, p.gc)
}

func main() {
	var o options
	flag.StringVar(&o.assets, "assets", "bin", "Directory holding kube-apiserver, etcd and kubectl.")
	flag.StringVar(&o.manager, "manager", "bin/manager", "Path of the lockwarden manager binary.")
	flag.StringVar(&o.crds, "crds", "config/crd/bases", "Directory of the CRD manifests.")
	flag.StringVar(&o.localConfig, "local-config", "config/local", "Kustomization installing the webhook configurations for a local manager.")
	flag.StringVar(&o.out, "out", "results", "Directory under which the run's folder (a UTC timestamp) is written.")
	flag.DurationVar(&o.timeout, "timeout", 40*time.Minute, "Deadline of the whole run.")
	flag.BoolVar(&o.quick, "quick", false, "Smaller sizes, for a run of about 2-3 minutes (fewer than the 300 handoffs issue 7 asks for); sizes given explicitly still win.")
	flag.StringVar(&o.phases, "phases", "", "Comma-separated phases to run, of floors,handoff,traced,expiry,throughput,permits,admission,deadwaiters,longqueue,failover,scale (default: all).")
	replicasFlag := flag.String("replicas", "1", "Manager replicas, each granting (--grants-on-every-replica); the API server calls the first one's webhooks, and the manager's CPU is that of all of them. A list such as 1,2 runs every phase with the first count and measures lockwarden's throughput phase with each, back to back, printing the CPU ratio to the first.")
	flag.IntVar(&o.handoffs, "handoffs", 0, "Handoffs measured per system (default 300; quick 50).")
	flag.IntVar(&o.leDefaultRounds, "le-default-rounds", 0, "Handoffs of client-go leader election at its defaults 15s/10s/2s (default 5; quick 1).")
	flag.IntVar(&o.tracedHandoffs, "traced-handoffs", 0, "Extra lockwarden handoffs measured one by one with the API server's and the manager's metrics, for the path breakdown (default 60; quick 10).")
	flag.IntVar(&o.expiryRounds, "expiry-rounds", 0, "Expiry handoffs per system, and leader failovers per election (default 20; quick 3).")
	flag.DurationVar(&o.window, "window", 0, "Throughput measuring window per system and width, and per count of permits (default 10s; quick 2s).")
	flag.IntVar(&o.parallel, "parallel", 0, "Resources (one worker each) of the parallel throughput run (default 64).")
	flag.IntVar(&o.admission, "admission", 0, "Guarded/unguarded write pairs of the admission phase (default 1000; quick 200).")
	flag.IntVar(&o.floors, "floors", 0, "Samples of each raw floor, etcd Put and API-server Update (default 1000; quick 300).")
	flag.IntVar(&o.scale, "scale", 0, "Live grants of the scale phase (default 10000; quick 1000).")
	flag.IntVar(&o.grantsPerRes, "grants-per-resource", 0, "Grants per resource in the scale phase: one Held, the rest waiting (default 10).")
	flag.IntVar(&o.probes, "probes", 0, "Request-to-Held probes on free resources at scale (default 200; quick 30).")
	flag.DurationVar(&o.retention, "retention", 0, "--finished-grant-retention of the manager in the scale phase (default 20s; quick 10s).")
	flag.DurationVar(&o.gcTimeout, "gc-timeout", 0, "How long past the retention to wait for finished grants to be collected (default 4m; quick 2m).")
	flag.IntVar(&o.longQueue, "long-queue", 0, "Requests in line on one resource in the long-queue phase, each released once Held (default 200; at least 152).")
	flag.IntVar(&o.deadWaiterRounds, "dead-waiter-rounds", 0, "Handoffs per case of the dead-waiter phase: k = 1 and 5 dead waiters ahead, killed --dead-waiter-lead and 0 s before the release (default 5; quick 2).")
	flag.DurationVar(&o.deadWaiterLead, "dead-waiter-lead", 0, "How long before the holder's release the dead waiters die, in the first pair of cases (default 5s, as in the issue's reproduction).")
	flag.Parse()
	var err error
	if o.replicas, err = parseReplicas(*replicasFlag); err != nil {
		fmt.Fprintf(os.Stderr, "lockwarden-bench: --replicas: %v\n", err)
		os.Exit(2)
	}
	o.defaults()
	if o.scale < o.grantsPerRes {
		o.scale = o.grantsPerRes
	}

	for _, p := range []*string{&o.assets, &o.manager, &o.crds, &o.localConfig, &o.out} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "lockwarden-bench: %v\n", err)
			os.Exit(2)
		}
		*p = abs
	}

	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		// After the first Ctrl-C, a second one kills the bench at once.
		<-sigCtx.Done()
		stopSignals()
	}()
	ctx, cancel := context.WithTimeout(sigCtx, o.timeout)
	err = run(ctx, o)
	cancel()

	switch {
	case err == nil:
	case sigCtx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "\nINTERRUPTED: everything the bench started has been stopped.")
		os.Exit(130)
	default:
		fmt.Fprintf(os.Stderr, "\nFAIL: %v\n", err)
		os.Exit(1)
	}
}

// parseReplicas parses a comma-separated list of replica counts, each at
// least 1, without repeats.
func parseReplicas(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a replica count (1 or more)", f)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("%d is listed twice", n)
		}
		out = append(out, n)
	}
	return out, nil
}

// runs reports whether the phase with key k is to run.
func (o options) runs(k string) bool {
	if o.phases == "" {
		return true
	}
	return slices.Contains(strings.Split(o.phases, ","), k)
}

// newScheme returns a scheme with the built-in types and lockwarden's.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(lockingv1alpha1.AddToScheme(s))
	return s
}
