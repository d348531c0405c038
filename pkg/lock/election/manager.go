package election

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/lockwarden/lockwarden/pkg/lock"
)

// SetupFunc builds the controllers of one term, exactly as a kubebuilder
// main.go builds them, on mgr (a view of the real manager whose Add keeps
// the controllers for this term) and with the term's stamping client:
//
//	func(mgr manager.Manager, t *election.Term) error {
//		return (&controller.FooReconciler{Client: t.Client(mgr.GetClient()), Scheme: mgr.GetScheme()}).SetupWithManager(mgr)
//	}
//
// It is called once per term, because a controller-runtime controller
// cannot be started twice. Register webhooks and other runnables that do
// not need leadership on the real manager, outside it.
type SetupFunc func(mgr manager.Manager, term *Term) error

// Runnable runs an Elector in a controller-runtime manager and, during each
// term, the controllers its SetupFunc builds, under the term's leader
// context. It does not need the manager's own leader election (which it
// replaces): run the manager with LeaderElection false, so that the cache,
// webhooks and metrics run on every replica and the Runnable starts with
// them. Create it with AddToManager.
type Runnable struct {
	mgr     manager.Manager
	setup   SetupFunc
	started func(context.Context, *Term)
	elector *Elector
	// fatal ends Start with an error: a term whose controllers could not
	// be built or started.
	mu    sync.Mutex
	fatal context.CancelCauseFunc
	// indexed are the field indexes a term added ("type/field"): the
	// informers keep them, and later terms' SetupFunc adds them again.
	indexed map[string]bool
}

var (
	_ manager.Runnable               = &Runnable{}
	_ manager.LeaderElectionRunnable = &Runnable{}
)

// AddToManager adds a Runnable to mgr that runs a fenced election with cfg
// and, while this replica leads, the controllers setup builds. A
// cfg.Callbacks.OnStartedLeading, when given, runs beside the term's
// controllers with the same leader context (the term ends for the next
// only once both returned); OnStoppedLeading and OnNewLeader are kept. The returned Elector answers IsLeader and Fence
// and is a health check (mgr.AddHealthzCheck("leader", e.Check)).
//
// When setup fails, or a controller fails to start while its term runs,
// the manager stops with that error, as it does for any runnable.
func AddToManager(mgr manager.Manager, cfg Config, setup SetupFunc) (*Elector, error) {
	if setup == nil {
		return nil, fmt.Errorf("INVALID_SPEC: election: a SetupFunc is required: %w", lock.ErrInvalidOption)
	}
	r := &Runnable{mgr: mgr, setup: setup, started: cfg.Callbacks.OnStartedLeading}
	cfg.Callbacks.OnStartedLeading = r.lead
	e, err := New(cfg)
	if err != nil {
		return nil, err
	}
	r.elector = e
	if err := mgr.Add(r); err != nil {
		return nil, err
	}
	return e, nil
}

// Elector returns the Runnable's elector.
func (r *Runnable) Elector() *Elector { return r.elector }

// NeedLeaderElection is false: the Runnable is the leader election.
func (r *Runnable) NeedLeaderElection() bool { return false }

// Start runs the election until ctx ends. It returns nil then, or the
// error of a term whose controllers could not be built or started.
func (r *Runnable) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.mu.Lock()
	r.fatal = cancel
	r.mu.Unlock()
	if _, err := logr.FromContext(ctx); err != nil {
		ctx = logr.NewContext(ctx, r.mgr.GetLogger())
	}
	if err := r.elector.Run(ctx); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// lead is OnStartedLeading: it builds the term's controllers and runs them
// until the leader context ends.
func (r *Runnable) lead(ctx context.Context, t *Term) {
	tm := &termManager{Manager: r.mgr, cache: &termCache{Cache: r.mgr.GetCache(), r: r}}
	defer func() {
		if err := tm.cache.removeHandlers(); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "Removing the event handlers of a finished term failed")
		}
	}()
	if err := r.setup(tm, t); err != nil {
		r.fail(fmt.Errorf("election: building the controllers of the term with fence %d: %w", t.Fence(), err))
		return
	}
	var wg sync.WaitGroup
	if r.started != nil {
		wg.Go(func() { r.started(ctx, t) })
	}
	for _, run := range tm.runnables {
		wg.Go(func() {
			if err := run.Start(ctx); err != nil && ctx.Err() == nil {
				r.fail(fmt.Errorf("election: a controller of the term with fence %d: %w", t.Fence(), err))
			}
		})
	}
	wg.Wait()
}

// indexField adds a field index once for the life of the manager's cache.
func (r *Runnable) indexField(ctx context.Context, c cache.Cache, obj client.Object, field string, fn client.IndexerFunc) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := fmt.Sprintf("%T/%s", obj, field)
	if r.indexed[key] {
		return nil
	}
	if err := c.IndexField(ctx, obj, field, fn); err != nil {
		return err
	}
	if r.indexed == nil {
		r.indexed = map[string]bool{}
	}
	r.indexed[key] = true
	return nil
}

func (r *Runnable) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fatal != nil {
		r.fatal(err)
	}
}

// termManager is the manager as one term's SetupFunc sees it: Add keeps the
// runnables for the term instead of handing them to the manager, and
// controller names may repeat (each term builds its controllers anew), and
// the event handlers its controllers add to the shared informers are
// removed when the term ends.
type termManager struct {
	manager.Manager
	cache     *termCache
	runnables []manager.Runnable
}

// GetCache returns the term's view of the manager's cache (termCache).
func (m *termManager) GetCache() cache.Cache { return m.cache }

// GetFieldIndexer returns the term's cache, which adds each field index
// only once across terms.
func (m *termManager) GetFieldIndexer() client.FieldIndexer { return m.cache }

// Add keeps r for the term instead of handing it to the manager.
func (m *termManager) Add(r manager.Runnable) error {
	m.runnables = append(m.runnables, r)
	return nil
}

// GetControllerOptions returns the manager's controller options with name
// validation skipped, since every term builds its controllers anew under
// the same names.
func (m *termManager) GetControllerOptions() config.Controller {
	o := m.Manager.GetControllerOptions()
	o.SkipNameValidation = ptr.To(true)
	return o
}
