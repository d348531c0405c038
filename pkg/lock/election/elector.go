package election

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// IdentityAnnotation is the annotation on each term's LockGrant that holds
// the candidate's Identity, which OnNewLeader reports.
const IdentityAnnotation = "election.lockwarden.io/identity"

// Defaults of Config.
const (
	// DefaultLeaseDuration is the term's lease (the grant's TTL) without
	// Config.LeaseDuration: 15 seconds, client-go's usual value.
	DefaultLeaseDuration = 15 * time.Second
	// DefaultHealthzTimeout is how long after its term ended a leader may
	// take to stop its work before Check reports it unhealthy.
	DefaultHealthzTimeout = 20 * time.Second
	// maxReleaseTimeout bounds the release at the end of a term.
	maxReleaseTimeout = 10 * time.Second
)

// Callbacks are the Elector's hooks, as in client-go's LeaderCallbacks.
type Callbacks struct {
	// OnStartedLeading runs when a term starts, on its own goroutine, with
	// the leader context (cancelled when the term ends) and the term. It
	// should return soon after ctx is cancelled: the next term waits for
	// it. Required.
	OnStartedLeading func(ctx context.Context, term *Term)
	// OnStoppedLeading runs after each term, once OnStartedLeading returned
	// and the grant was released. Optional.
	OnStoppedLeading func()
	// OnNewLeader runs when the resource's holder changes to a term of
	// another identity than last reported (this elector's own included),
	// with that term's Identity. It runs on the elector's watch goroutine
	// and must return quickly. Optional.
	OnNewLeader func(identity string)
}

// Config configures an Elector.
type Config struct {
	// Client talks to the API server directly (client.NewWithWatch, never an
	// informer cache) as the identity that owns the terms' grants; its
	// scheme must include api/v1alpha1. Required.
	Client client.WithWatch
	// Namespace holds the grants, the FenceCounter and the guarded objects
	// the leader writes (a guarded object takes grants of its own
	// namespace only). Default lock.DefaultNamespace.
	Namespace string
	// Resource is the lock's resource ID, e.g. "controllers/my-operator":
	// every candidate of one election uses the same. Required.
	Resource string
	// Identity names this candidate (a Pod name, hostname_uuid), as
	// OnNewLeader reports it. Candidates should not share one. Required.
	Identity string
	// LeaseDuration is each term's lease (the grant's TTL), whole seconds
	// from 1 to 3600. A leader that stops renewing loses its term after
	// at most LeaseDuration minus the handle's safety margin by its own
	// clock, and the next candidate is granted when the registry sees the
	// lease expire. Default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// HealthzTimeout: Check fails when a term ended this long ago and its
	// OnStartedLeading has still not returned. Default DefaultHealthzTimeout.
	HealthzTimeout time.Duration
	// Callbacks are the hooks; OnStartedLeading is required.
	Callbacks Callbacks
	// LockOptions are extra options of every term's Acquire, e.g.
	// lock.WithPolicy, lock.WithSafetyMargin, lock.WithLogger, lock.WithClock.
	LockOptions []lock.Option
	// Clock measures how long a finished term's work takes to stop (Check)
	// and how long a term lasted, and times the pause before queuing again
	// after a failed request. The terms' handles take theirs from
	// LockOptions (lock.WithClock). Default clock.RealClock. For tests.
	Clock clock.Clock
}

// Elector runs one candidate of a fenced election. Create it with New; all
// methods are safe for concurrent use.
type Elector struct {
	cfg     Config
	running atomic.Bool

	mu   sync.Mutex
	term *Term
	// ending is when the current term's leader context was cancelled;
	// zero while it runs.
	ending time.Time
}

// New checks cfg and returns an Elector. Errors start with INVALID_SPEC and
// match lock.ErrInvalidOption.
func New(cfg Config) (*Elector, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("INVALID_SPEC: election: "+format+": %w", append(args, lock.ErrInvalidOption)...)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = lock.DefaultNamespace
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.HealthzTimeout == 0 {
		cfg.HealthzTimeout = DefaultHealthzTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	switch {
	case cfg.Client == nil:
		return nil, invalid("Client is required")
	case !lockingv1alpha1.ValidResourceID(cfg.Resource):
		return nil, invalid("Resource %q does not match %s", cfg.Resource, lockingv1alpha1.ResourcePattern)
	case cfg.Identity == "":
		return nil, invalid("Identity is required")
	case cfg.LeaseDuration%time.Second != 0 || cfg.LeaseDuration < time.Second || cfg.LeaseDuration > time.Hour:
		return nil, invalid("LeaseDuration %s is not a whole number of seconds from 1 to 3600", cfg.LeaseDuration)
	case cfg.HealthzTimeout < 0:
		return nil, invalid("negative HealthzTimeout %s", cfg.HealthzTimeout)
	case cfg.Callbacks.OnStartedLeading == nil:
		return nil, invalid("Callbacks.OnStartedLeading is required")
	}
	return &Elector{cfg: cfg}, nil
}

// Run takes part in the election until ctx ends: it queues for a term
// (one LockGrant on Config.Resource), leads while the term lasts, releases
// it, and queues again. It watches the resource's holder for OnNewLeader
// meanwhile. When ctx ends during a term, the leader context is cancelled,
// and Run releases the grant once OnStartedLeading returned, so the next
// candidate is granted at once. Run returns nil when ctx ended, and an
// error if it is already running.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("election: Run is already running")
	}
	defer e.running.Store(false)
	log := logr.FromContextOrDiscard(ctx).WithName("election").WithValues("resource", e.cfg.Resource, "identity", e.cfg.Identity)
	ctx = logr.NewContext(ctx, log)

	opts := append([]lock.Option{lock.WithNamespace(e.cfg.Namespace), lock.WithTTL(e.cfg.LeaseDuration)}, e.cfg.LockOptions...)
	locks := lock.NewClient(e.cfg.Client, opts...)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.releaseTimeout())
		defer cancel()
		_ = locks.Close(cctx)
	}()

	var wg sync.WaitGroup
	defer wg.Wait()
	if e.cfg.Callbacks.OnNewLeader != nil {
		wg.Go(func() { e.watchLeader(ctx) })
	}

	// Retries of a failed request: from half a second, doubling up to the
	// lease duration.
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: e.cfg.LeaseDuration}
	}
	b := newBackoff()
	for ctx.Err() == nil {
		h, err := locks.Acquire(ctx, e.cfg.Resource, lock.WithAnnotations(map[string]string{IdentityAnnotation: e.cfg.Identity}))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Error(err, "Queuing for leadership failed; trying again")
			select {
			case <-ctx.Done():
			case <-e.cfg.Clock.After(b.Step()):
			}
			continue
		}
		b = newBackoff()
		e.lead(logr.NewContext(ctx, log), h)
	}
	return nil
}

// lead runs one term on h until it ends, then releases h.
func (e *Elector) lead(ctx context.Context, h *lock.Handle) {
	log := logr.FromContextOrDiscard(ctx)
	leaderCtx, cancel := context.WithCancelCause(h.Context())
	stop := context.AfterFunc(ctx, func() { cancel(fmt.Errorf("election: stopped: %w", context.Cause(ctx))) })
	defer stop()
	t := &Term{h: h, ctx: leaderCtx, identity: e.cfg.Identity}
	e.mu.Lock()
	e.term, e.ending = t, time.Time{}
	e.mu.Unlock()
	start := e.cfg.Clock.Now()
	info := h.Info()
	log.Info("Started leading", "fence", info.Fence, "grant", klog.KRef(info.Grant.Namespace, info.Grant.Name))

	done := make(chan struct{})
	go func() {
		defer close(done)
		e.cfg.Callbacks.OnStartedLeading(leaderCtx, t)
	}()
	<-leaderCtx.Done()
	e.mu.Lock()
	e.ending = e.cfg.Clock.Now()
	e.mu.Unlock()
	<-done

	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), e.releaseTimeout())
	err := h.Release(rctx)
	rcancel()
	cancel(nil)
	e.mu.Lock()
	e.term, e.ending = nil, time.Time{}
	e.mu.Unlock()
	log.Info("Stopped leading", "fence", info.Fence, "cause", context.Cause(leaderCtx).Error(), "led", e.cfg.Clock.Since(start).String(),
		"releaseRefused", lock.Refusal(err) != nil)
	if e.cfg.Callbacks.OnStoppedLeading != nil {
		e.cfg.Callbacks.OnStoppedLeading()
	}
}

// releaseTimeout bounds the release of a finished term.
func (e *Elector) releaseTimeout() time.Duration {
	return min(e.cfg.LeaseDuration, maxReleaseTimeout)
}

// current returns the running term, or nil.
func (e *Elector) current() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term
}

// IsLeader reports whether this candidate leads now: a term is running and
// its handle still passes Check (its local deadline has not passed).
func (e *Elector) IsLeader() bool {
	t := e.current()
	if t == nil || t.ctx.Err() != nil {
		return false
	}
	_, err := t.h.Check()
	return err == nil
}

// Fence returns the fencing token of the current term while IsLeader, and
// 0 otherwise.
func (e *Elector) Fence() int64 {
	t := e.current()
	if t == nil || !e.IsLeader() {
		return 0
	}
	return t.Fence()
}

// Name is the name of the health check, as client-go's HealthzAdaptor's.
func (e *Elector) Name() string { return "leaderElection" }

// Check is a health check (controller-runtime's healthz.Checker:
// mgr.AddHealthzCheck("leader", e.Check)). It fails when a term ended more
// than Config.HealthzTimeout ago and its OnStartedLeading has still not
// returned: the process keeps working for a term it lost, and should be
// restarted. Followers and running leaders are healthy.
func (e *Elector) Check(_ *http.Request) error {
	e.mu.Lock()
	t, ending := e.term, e.ending
	e.mu.Unlock()
	if t == nil || ending.IsZero() {
		return nil
	}
	if d := e.cfg.Clock.Since(ending); d > e.cfg.HealthzTimeout {
		return fmt.Errorf("election: the term with fence %d of %s ended %s ago and its work has not stopped", t.Fence(), e.cfg.Resource, d.Round(time.Millisecond))
	}
	return nil
}
