package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// workerCommand is the hidden subcommand a worker process runs.
const workerCommand = "worker"

// Worker behaviour. The numbers make leases short and busy: a worker holds
// a grant for a few writes (its handle renews it a third of the TTL after
// each confirmed send), and sometimes walks away without releasing it, so
// that both handoff paths (release and expiry) happen without faults too.
const (
	maxWritesPerGrant = 6
	maxThink          = 400 * time.Millisecond
	maxCompute        = 150 * time.Millisecond
	abandonRate       = 0.1
	// strayRate is how often a worker, once its grant has ended, sends a
	// request that asserts nothing (stray).
	strayRate = 0.5
	// strayWait bounds how long a stray request waits for a successor to
	// write the object first.
	strayWait = 5 * time.Second
	// unknownPatience is how long a worker whose handle is in
	// OWNERSHIP_UNKNOWN lets it learn how the grant ended before it gives
	// the grant up with a release.
	unknownPatience = 2 * time.Second
	// settleTimeout bounds the wait for a final answer after a release.
	settleTimeout = 10 * time.Second
)

// workerOptions are the worker subcommand's flags.
type workerOptions struct {
	id         string
	kubeconfig string
	namespace  string
	history    string
	resources  []string
	ttl        time.Duration
	seed       uint64
	// replicaOf names the worker that runs as the same service account
	// (a replica of the same Deployment), or "".
	replicaOf string
	// requestTimeout bounds every request to a guarded object (the
	// handle bounds its own).
	requestTimeout time.Duration
	// waitTimeout is the grants' spec.waitTimeoutSeconds.
	waitTimeout time.Duration
}

// worker is one worker process: it takes grants on random resources with
// pkg/lock and writes fenced increments while its handle says it may.
type worker struct {
	o   workerOptions
	c   client.WithWatch
	rec *recorder
	rnd *rand.Rand
	// seq numbers the worker's operations (its handles' renewals too).
	seq atomic.Int64
	// armed is set by SIGUSR1 and cleared by SIGUSR2 (the chaos driver):
	// pause before the next write.
	armed atomic.Bool
}

// runWorker runs `lockwarden-chaos worker ...` and returns the exit code.
func runWorker(args []string) int {
	var o workerOptions
	var resources string
	fs := flag.NewFlagSet(workerCommand, flag.ContinueOnError)
	fs.StringVar(&o.id, "id", "", "The worker's name, e.g. worker-3; prefixes its operation IDs.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig of the worker's identity (pointing at its fault proxy).")
	fs.StringVar(&o.namespace, "namespace", chaosNamespace, "Namespace of the grants and the guarded objects.")
	fs.StringVar(&o.history, "history", "", "File the worker appends its history to.")
	fs.StringVar(&resources, "resources", "", "Comma-separated resource IDs to contend for.")
	fs.DurationVar(&o.ttl, "ttl", defaultTTL, "Lease duration of every grant (whole seconds).")
	fs.Uint64Var(&o.seed, "seed", 1, "Seed of the worker's choices.")
	fs.StringVar(&o.replicaOf, "replica-of", "", "The worker that runs as the same service account, if any.")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 3*time.Second, "Deadline of every request to a guarded object.")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 20*time.Second, "How long a grant may wait in the queue (spec.waitTimeoutSeconds).")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.resources = strings.Split(resources, ",")
	if o.id == "" || o.kubeconfig == "" || o.history == "" || resources == "" || o.ttl < time.Second {
		fmt.Fprintln(os.Stderr, "worker: --id, --kubeconfig, --history, --resources and a --ttl of at least 1s are required")
		return 2
	}
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr)))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w, err := newWorker(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker %s: %v\n", o.id, err)
		return 1
	}
	defer w.rec.close()
	arm := make(chan os.Signal, 4)
	signal.Notify(arm, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for sig := range arm {
			w.armed.Store(sig == syscall.SIGUSR1)
		}
	}()
	w.run(ctx)
	return 0
}

func newWorker(o workerOptions) (*worker, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, err
	}
	// HTTP/1.1: one connection per request in flight, so a request stuck
	// behind a blackholed connection does not hold up the others (over
	// HTTP/2 they would share it until the health check kills it).
	cfg.NextProtos = []string{"http/1.1"}
	cfg.QPS, cfg.Burst = 200, 400
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: newScheme()})
	if err != nil {
		return nil, err
	}
	rec, err := newRecorder(o.history, o.id)
	if err != nil {
		return nil, err
	}
	return &worker{
		o: o, c: c, rec: rec,
		rnd: rand.New(rand.NewPCG(o.seed, 0x6c6f636b)),
	}, nil
}

// run takes grants until ctx ends; then it releases what it holds and
// returns.
func (w *worker) run(ctx context.Context) {
	for ctx.Err() == nil {
		resource := w.o.resources[w.rnd.IntN(len(w.o.resources))]
		if l := w.acquire(ctx, resource); l != nil {
			w.hold(ctx, l)
		}
		_ = sleep(ctx, w.between(0, maxThink))
	}
}

// hold writes a few increments under l, then releases it or, sometimes,
// walks away and lets it expire. It stops writing as soon as the handle's
// Done closes; a handle in OWNERSHIP_UNKNOWN gets a moment to learn how
// the grant ended before the worker gives the grant up.
func (w *worker) hold(ctx context.Context, l *lease) {
	// Cleanup runs even when ctx ends (SIGTERM at the end of the run).
	after := context.WithoutCancel(ctx)
	writes := 1 + w.rnd.IntN(maxWritesPerGrant)
	for i := 0; i < writes && ctx.Err() == nil && l.holds(); i++ {
		if !w.increment(ctx, l) {
			break
		}
		l.wait(ctx, w.between(0, maxThink))
	}
	if ctx.Err() == nil && l.holds() && w.rnd.Float64() < abandonRate {
		l.abandon() // the grant expires; the successor waits for it
		return
	}
	if l.h.State() == holder.OwnershipUnknown {
		l.settle(ctx, unknownPatience, func(st holder.State) bool { return st != holder.OwnershipUnknown })
	}
	l.release(after)
	final := l.settle(after, settleTimeout, holder.State.Final)
	if ctx.Err() == nil && final && w.rnd.Float64() < strayRate {
		w.stray(ctx, l)
	}
}

// between returns a random duration in [lo, hi).
func (w *worker) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rnd.Int64N(int64(hi-lo)))
}

// next returns the next operation number.
func (w *worker) next() int64 { return w.seq.Add(1) }

// nextID returns a new operation ID: the worker's name, a letter for the
// operation and a sequence number.
func (w *worker) nextID(letter string) string {
	return fmt.Sprintf("%s-%s%d", w.o.id, letter, w.next())
}

// requestCtx bounds one API request.
func (w *worker) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, w.o.requestTimeout)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
