package lockgrant

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// CounterNameField indexes LockGrants by the name of their resource's
// FenceCounter, so that one resource's grants are listed from the cache.
const CounterNameField = "spec.resource.counterName"

// ResourceField is the LockGrant field the API server selects on
// (selectableFields in its CRD): a pass lists a resource's grants
// directly by it.
const ResourceField = "spec.resource"

// PolicyField indexes LockGrants by spec.policy.
const PolicyField = "spec.policy"

// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=lockgrants,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=lockgrants/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=fencecounters,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=guardpolicies;fenceissuers,verbs=get;list;watch

// Reconciler grants LockGrants of one resource at a time; see the package doc.
type Reconciler struct {
	// Client reads grants from the cache and writes.
	Client client.Client
	// APIReader reads directly from the API server: the counter after a
	// compare-and-swap conflicted or before a plan no swap validates, the
	// grant a swap is about to name, and the holder grant where the cache
	// may mislead.
	APIReader client.Reader
	// Clock is the controller's clock, by which every lease is judged.
	Clock clock.PassiveClock
	// Recorder emits an Event for every exceptional transition (see emit).
	Recorder events.EventRecorder
	// Keyring gives the issuer epoch and the Active signing key.
	Keyring Keyring
	// FreshKeyring reads the same directly from the API server. It is read
	// only when a counter records a fence of a later epoch than Keyring
	// says (another replica may have issued in an epoch this one's cache
	// has not seen yet), before anyone is held back for it; nil: never.
	FreshKeyring Keyring
	// FinishedGrantRetention is how long a grant is kept after it ended
	// (Released, Expired, TimedOut) before the controller deletes it; 0
	// keeps finished grants forever. The FenceCounter is never deleted, so
	// fences keep increasing after their grants are gone.
	FinishedGrantRetention time.Duration
	// RequestIDWindow is how long a request ID stays spent after its grant
	// ended once the grant is deleted: the request ID is recorded in the
	// namespace's RequestIDLedger before the grant goes (ledger.go). 0
	// records nothing.
	RequestIDWindow time.Duration
	// NeedLeaderElection, when false, runs this controller on every manager
	// replica at once, not only on the elected leader: the counter's
	// compare-and-swap and the transition rules of every status write
	// serialize replicas (docs/ha.md), so a replica that dies
	// costs no failover wait. nil keeps controller-runtime's default (only
	// the leader runs it).
	NeedLeaderElection *bool
	// Ownership, when set, leaves each resource to its preferred replica
	// for a takeover delay (ownership.go); nil acts on every event at once.
	Ownership *Ownership
	// Floors gives the fences guarded objects were found to have recorded
	// for a resource (internal/recovery): no fence at or below one is
	// issued. nil: none known.
	Floors FloorSource

	// sessionsSeen holds the controller's observations of session Leases.
	sessionsSeen sessionTracker
	// own holds this replica's writes its caches do not show yet
	// (ownwrites.go).
	own ownWrites
	// grantsSeen is how far the grants' cache has caught up (seen.go).
	grantsSeen seenMark
	// statuses writes the passes' statuses off the passes (statuses.go);
	// nil (a Reconciler not set up with a manager) writes them in the
	// pass.
	statuses *statusWriter
}

// FloorSource gives the floors of resource in namespace ns and its slots,
// by fenced resource ID (grantplan.Facts.Floors), and confirms one by
// reading its object again (recovery.Scanner).
type FloorSource interface {
	Floors(ns, resource string) map[string]grantplan.Floor
	Confirm(ctx context.Context, ns, resource, fenced string) (grantplan.Floor, error)
}

// Keyring is the issuer's state the controller issues grants with.
type Keyring interface {
	Params(ctx context.Context) (issuer.Params, error)
}

// SetupWithManager registers the controller and the grant index.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &lockingv1alpha1.LockGrant{}, CounterNameField, func(o client.Object) []string {
		return []string{lockingv1alpha1.FenceCounterName(o.(*lockingv1alpha1.LockGrant).Spec.Resource)}
	}); err != nil {
		return fmt.Errorf("indexing lockgrants: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &lockingv1alpha1.LockGrant{}, PolicyField, func(o client.Object) []string {
		if p := o.(*lockingv1alpha1.LockGrant).Spec.Policy; p != "" {
			return []string{p}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing lockgrants: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &lockingv1alpha1.LockGrant{}, SessionField, func(o client.Object) []string {
		if s := o.(*lockingv1alpha1.LockGrant).Spec.Session; s != nil {
			return []string{s.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing lockgrants: %w", err)
	}
	r.statuses = newStatusWriter(r, r.NeedLeaderElection == nil || *r.NeedLeaderElection)
	if err := mgr.Add(r.statuses); err != nil {
		return fmt.Errorf("adding the status writer: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("lockgrant").
		// Counters of every slot, decided with their resource (slot 0's
		// counter name), except this replica's own writes.
		Watches(&lockingv1alpha1.FenceCounter{}, r.counterEvents()).
		// Grants: creation, deletion, and changes of spec (renew, release)
		// or annotations (a reported fence regression). Status changes are
		// this controller's own writes and need no second pass.
		Watches(&lockingv1alpha1.LockGrant{}, r.grantEvents()).
		// A status write that was refused or never got through.
		WatchesRawSource(source.Channel(r.statuses.kick, &handler.TypedEnqueueRequestForObject[*lockingv1alpha1.FenceCounter]{})).
		// A new epoch or revoked epoch can revoke grants of any resource.
		Watches(&lockingv1alpha1.FenceIssuer{}, handler.EnqueueRequestsFromMapFunc(r.allResources),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A policy change can revoke the grants issued under it.
		Watches(&lockingv1alpha1.GuardPolicy{}, handler.EnqueueRequestsFromMapFunc(r.resourcesUnderPolicy),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Session Leases: their changes are the controller's observations of
		// client liveness; an ended session withdraws its requests.
		Watches(&coordinationv1.Lease{}, r.sessionEvents(), builder.WithPredicates(predicate.NewPredicateFuncs(isSession))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 16, NeedLeaderElection: r.NeedLeaderElection}).
		Complete(r)
}

// resourceOf maps a grant to its resource's reconcile request.
func resourceOf(_ context.Context, o client.Object) []reconcile.Request {
	g := o.(*lockingv1alpha1.LockGrant)
	return []reconcile.Request{{NamespacedName: types.NamespacedName{
		Namespace: g.Namespace, Name: lockingv1alpha1.FenceCounterName(g.Spec.Resource),
	}}}
}

// isSlotZero reports whether a FenceCounter is the one a resource's
// reconcile request is named after: slot 0's, the resource's own.
func isSlotZero(o client.Object) bool {
	_, k, _ := lockingv1alpha1.ParseSlotResource(o.(*lockingv1alpha1.FenceCounter).Spec.Resource)
	return k == 0
}

// counterEvents reconciles the resource of a counter that was created,
// deleted or changed in spec (its generation moved), unless the change is
// this replica's own compare-and-swap: the pass that made it has already
// decided on it, and a pass on it would only find its statuses not cached
// yet (ownWrites).
func (r *Reconciler) counterEvents() handler.EventHandler {
	add := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range resourceOfCounter(ctx, o) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if !r.own.sawCounter(client.ObjectKeyFromObject(e.Object), "", e.Object.GetResourceVersion()) {
				add(ctx, e.Object, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			own := r.own.sawCounter(client.ObjectKeyFromObject(e.ObjectNew), e.ObjectOld.GetResourceVersion(), e.ObjectNew.GetResourceVersion())
			if own {
				selfEvents.Inc()
				return
			}
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() {
				add(ctx, e.ObjectNew, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
	}
}

// grantEvents reconciles a grant's resource when the grant is created or
// deleted, or its spec (a renew, a release) or annotations (a reported
// fence regression) change; a status change is a controller's write and
// starts no pass. Every version is noted, so that this replica stops
// standing in for the cache once it shows this replica's status
// (ownWrites).
func (r *Reconciler) grantEvents() handler.EventHandler {
	add := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range resourceOf(ctx, o) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.grantsSeen.see(e.Object.GetResourceVersion())
			add(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.grantsSeen.see(e.ObjectNew.GetResourceVersion())
			r.own.sawGrant(e.ObjectNew.GetUID(), e.ObjectOld.GetResourceVersion(), e.ObjectNew.GetResourceVersion())
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() || !maps.Equal(e.ObjectOld.GetAnnotations(), e.ObjectNew.GetAnnotations()) {
				add(ctx, e.ObjectNew, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.grantsSeen.see(e.Object.GetResourceVersion())
			r.own.sawGrant(e.Object.GetUID(), e.Object.GetResourceVersion(), "")
			add(ctx, e.Object, q)
		},
	}
}

// resourceOfCounter maps a counter of any slot to its resource's
// reconcile request.
func resourceOfCounter(_ context.Context, o client.Object) []reconcile.Request {
	c := o.(*lockingv1alpha1.FenceCounter)
	base, _, ok := lockingv1alpha1.ParseSlotResource(c.Spec.Resource)
	if !ok {
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(c)}}
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: lockingv1alpha1.FenceCounterName(base)}}}
}

// allResources maps to every resource that has a counter.
func (r *Reconciler) allResources(ctx context.Context, _ client.Object) []reconcile.Request {
	var list lockingv1alpha1.FenceCounterList
	if err := r.Client.List(ctx, &list); err != nil {
		logf.FromContext(ctx).Error(err, "Listing fence counters")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	seen := map[reconcile.Request]bool{}
	for i := range list.Items {
		if isSlotZero(&list.Items[i]) {
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
			seen[req] = true
			reqs = append(reqs, req)
		}
	}
	// And the resources that have no counter (yet, or any more): a
	// request held back by a fence a guarded object recorded for a
	// resource whose counter was lost waits for the new epoch too.
	var grants lockingv1alpha1.LockGrantList
	if err := r.Client.List(ctx, &grants, client.UnsafeDisableDeepCopy); err != nil {
		logf.FromContext(ctx).Error(err, "Listing grants")
		return reqs
	}
	for i := range grants.Items {
		if grants.Items[i].Status.Phase.Final() {
			continue
		}
		for _, req := range resourceOf(ctx, &grants.Items[i]) {
			if !seen[req] {
				seen[req] = true
				reqs = append(reqs, req)
			}
		}
	}
	return reqs
}

// resourcesUnderPolicy maps a policy to the resources of its grants.
func (r *Reconciler) resourcesUnderPolicy(ctx context.Context, o client.Object) []reconcile.Request {
	var list lockingv1alpha1.LockGrantList
	if err := r.Client.List(ctx, &list, client.MatchingFields{PolicyField: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "Listing grants of a policy", "policy", o.GetName())
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		reqs = append(reqs, resourceOf(ctx, &list.Items[i])...)
	}
	return reqs
}

// Reconcile brings one resource's grants and counter up to date.
//
// A pass decides on the counter as this replica's cache shows it (with its
// own writes the cache does not show yet): the compare-and-swap of each
// counter it writes validates that read, and a Conflict decides the pass
// again at once on a direct read. A plan that a compare-and-swap does not
// stand behind (it writes statuses, but not every counter it was decided
// on) is decided again on a direct read before it is written. The pass
// returns after its counter writes; its statuses follow them (statuses.go).
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if res, left := r.leaveToPreferred(ctx, req); left {
		return res, nil // another replica is preferred for it (ownership.go)
	}
	if r.statuses != nil {
		defer r.statuses.end(req.NamespacedName)
	}
	mode := cachedCounters
	for round := 1; ; round++ {
		if r.statuses != nil {
			r.statuses.begin(req.NamespacedName)
		}
		f, p, err := r.decide(ctx, req, mode)
		if errors.Is(err, errCacheBehind) {
			logf.FromContext(ctx).V(1).Info("Grants cache behind the API server; deciding again once it caught up")
			return reconcile.Result{RequeueAfter: cacheCatchUp}, nil
		}
		if err != nil || f.Resource == "" {
			return reconcile.Result{}, err
		}
		if mode != directCounters && !validated(f.Facts, p) {
			mode = directCounters
			continue
		}
		counters, err := r.writeCounters(ctx, req.Namespace, f.Facts, p)
		if apierrors.IsConflict(err) && round < maxPassRounds {
			// The counter moved since it was read: decide again on a
			// direct read, at once (a sleep would only delay the
			// handoff; the other writer has already written).
			counterConflicts.Inc()
			mode = directCounters
			continue
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		signed := grantplan.SignSlots(p, f.key, func(k int32) string {
			if c := counters[k]; c != nil {
				return c.ResourceVersion
			}
			return ""
		})
		for _, sg := range signed {
			sg.Grant.Status.Record, sg.Grant.Status.Proof = sg.Record, sg.Proof
		}
		for _, g := range p.Statuses {
			if c := counters[g.HeldSlot()]; c != nil {
				g.Status.CounterGeneration = c.Generation
			}
		}
		if err := r.writeStatuses(ctx, req.NamespacedName, p); err != nil {
			if errors.Is(err, errStatusesDropped) {
				// Its counters are written; its statuses may rest on plans
				// that were dropped: decide them again on what is stored.
				statusesRedecided.Inc()
				if round < maxPassRounds {
					continue
				}
				return reconcile.Result{RequeueAfter: statusAgainAfter}, nil
			}
			if refused(err) {
				// A newer status is stored than the one decided on:
				// decide again once the cache shows it.
				logf.FromContext(ctx).V(1).Info("Status write refused; deciding again", "error", err.Error())
				return reconcile.Result{RequeueAfter: statusAgainAfter}, nil
			}
			return reconcile.Result{}, err
		}
		if err := r.deleteFinished(ctx, p); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: p.RequeueAfter}, nil
	}
}

// maxPassRounds bounds how often one pass decides again after its
// compare-and-swap conflicted; then it returns the Conflict, and the
// controller retries it with its backoff.
const maxPassRounds = 5

// readMode says where a pass reads the counters it decides on.
type readMode int

const (
	// cacheOnly reads everything from the cache, the holder grant
	// included: ownership's check of another replica's work.
	cacheOnly readMode = iota
	// cachedCounters reads the counters from the cache, with this
	// replica's own writes in place of older copies, for a plan that a
	// compare-and-swap validates.
	cachedCounters
	// directCounters reads the counters directly from the API server.
	directCounters
)

// validated reports whether p's compare-and-swaps validate every counter
// p was decided on: p writes them all, or writes nothing but deletes.
// Otherwise a counter decided on from the cache could be behind the API
// server with nothing to refuse the statuses decided on it.
func validated(f grantplan.Facts, p grantplan.Plan) bool {
	if len(p.Statuses) == 0 {
		return true
	}
	written := map[int32]bool{}
	for _, w := range grantplan.CounterWrites(f, p) {
		written[w.Slot] = true
	}
	for _, k := range slotsWanted(f.Grants) {
		if !written[k] {
			return false
		}
	}
	return written[0]
}

// scope is what a pass gathered about one resource: the facts it decides
// on, and the issuer's Active key it signs the records of new holders with
// (grantplan.Sign), which deciding does not need.
type scope struct {
	grantplan.Facts
	key issuer.Params
}

// gather reads what decide needs: the resource's grants from the cache,
// then its counters as mode says. The counter carries its holder's live
// lease (spec.holder.expiresAt), so the holder's expiry is judged on it,
// and every change of the holder or its lease is a compare-and-swap on it.
// This replica's own writes stand in for copies the cache has not caught
// up with (ownWrites): a pass never decides on a counter or a status older
// than what this replica wrote. The holder grant is read directly too
// only when the cache may mislead (refreshHolder): it is missing, its
// lease is over, or the counter predates the lease it now carries.
// The issuer's Active key comes with the facts, apart from them: deciding
// does not need it, signing the new holders' records does.
func (r *Reconciler) gather(ctx context.Context, req reconcile.Request, mode readMode) (scope, error) {
	var s scope
	f := &s.Facts
	f.Retention = r.FinishedGrantRetention
	var list lockingv1alpha1.LockGrantList
	// Decide copies every grant it changes: the cache's objects are
	// listed as they are, not copied.
	if err := r.Client.List(ctx, &list, client.InNamespace(req.Namespace), client.MatchingFields{CounterNameField: req.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return s, fmt.Errorf("listing grants: %w", err)
	}
	// The clock is read after the grants: every create and renew the pass
	// acts on was then sent before Now, so a lease the pass starts or
	// extends from Now lasts at least its TTL from the send time the
	// holder counts its deadline from (pkg/lock/holder), however long
	// this process pauses between reading the clock and the grants.
	f.Now = r.Clock.Now()
	f.Grants = r.own.grants(list.Items, f.Now)

	counter, err := r.readCounter(ctx, req.NamespacedName, mode, f.Now)
	if err != nil {
		return s, fmt.Errorf("reading fence counter: %w", err)
	}
	f.Counter = counter

	if counter != nil {
		if _, k, _ := lockingv1alpha1.ParseSlotResource(counter.Spec.Resource); k > 0 {
			// Another slot's counter: its resource's pass decides it.
			return scope{}, nil
		}
		f.Resource = counter.Spec.Resource
		if h := counter.Spec.Holder; h != nil {
			if err := r.refreshHolder(ctx, mode, f, req.Namespace, h); err != nil {
				return s, err
			}
		}
	} else if len(f.Grants) > 0 {
		f.Resource = f.Grants[0].Spec.Resource
	}
	if len(f.Grants) == 0 {
		return s, nil // at most a stale holder to clear; no issuing
	}
	if err := r.gatherSlots(ctx, mode, f, req.Namespace); err != nil {
		return s, err
	}
	params, err := r.Keyring.Params(ctx)
	if err != nil {
		return s, err
	}
	if r.FreshKeyring != nil && counterAhead(*f, params.Epoch) {
		if params, err = r.FreshKeyring.Params(ctx); err != nil {
			return s, err
		}
	}
	s.key, f.Epoch, f.Revoked = params, params.Epoch, params.Revoked
	if r.Floors != nil {
		if f.Floors, err = r.confirmedFloors(ctx, req.Namespace, *f); err != nil {
			return s, err
		}
	}
	if f.Policies, err = r.policies(ctx, f.Grants); err != nil {
		return s, err
	}
	if f.Sessions, err = r.sessions(ctx, req.Namespace, f.Grants, f.Now); err != nil {
		return s, err
	}
	return s, nil
}

// confirmedFloors returns the floors of f's resource and its slots; a floor
// above its slot's counter, which would hold a request back, is confirmed
// first by reading its object again (an object deleted since the scan holds
// nothing back). Floors at or below their counters cost no read.
func (r *Reconciler) confirmedFloors(ctx context.Context, ns string, f grantplan.Facts) (map[string]grantplan.Floor, error) {
	floors := r.Floors.Floors(ns, f.Resource)
	var out map[string]grantplan.Floor
	for fenced, fl := range floors {
		_, k, ok := lockingv1alpha1.ParseSlotResource(fenced)
		if !ok {
			continue
		}
		var counter int64
		if c := counterOf(f, k); c != nil {
			counter = c.Spec.Fence
		}
		if fl.Fence <= counter {
			continue
		}
		now, err := r.Floors.Confirm(ctx, ns, f.Resource, fenced)
		if err != nil {
			return nil, fmt.Errorf("confirming the fence %s recorded on %s: %w", fencing.FormatFence(fl.Fence), fl.Where, err)
		}
		if now == fl {
			continue
		}
		if out == nil {
			out = maps.Clone(floors)
		}
		if now.Fence == 0 {
			delete(out, fenced)
		} else {
			out[fenced] = now
		}
	}
	if out != nil {
		return out, nil
	}
	return floors, nil
}

// readCounter reads counter key as mode says: nil when it does not exist.
func (r *Reconciler) readCounter(ctx context.Context, key types.NamespacedName, mode readMode, now time.Time) (*lockingv1alpha1.FenceCounter, error) {
	var reader client.Reader = r.Client
	if mode == directCounters {
		reader = r.APIReader
	}
	c := &lockingv1alpha1.FenceCounter{}
	switch err := reader.Get(ctx, key, c); {
	case apierrors.IsNotFound(err):
		c = nil
	case err != nil:
		return nil, err
	}
	return r.own.counter(key, c, mode == directCounters, now), nil
}

// errCacheBehind: the grants the pass would grant kept differing from
// their cached copies; the pass waits for the cache to catch up.
var errCacheBehind = errors.New("the grants cache is behind the API server")

const (
	// maxConfirmRounds bounds how often one pass decides again on grants
	// read directly because their cached copies were out of date.
	maxConfirmRounds = 4
	// cacheCatchUp is how long a pass whose cache was far behind waits
	// before it is decided again.
	cacheCatchUp = 100 * time.Millisecond
)

// decide gathers and plans the pass. Two kinds of grant are read directly
// (grantplan.NewHolders, grantplan.EndsUnnamed), after the counter, before
// the plan is written: the grant a counter's swap is about to name as a
// new holder, and a grant the plan ends because its copy reads Held while
// no counter names it. The grants are listed from a cache that may be
// behind the counters (a replica that just started, or resumed after a
// freeze, reads its counters fresh while its grants' informer catches up),
// and both decisions must rest on a copy as fresh as the counter.
//
// A new holder still at the version the pass listed is confirmed. A cached
// copy that is out of date (the grant was released, withdrawn, deleted, or
// changed since the cache last saw it) is replaced by the fresh one, and
// the pass is gathered and decided again: the counters are read again too,
// so that, as in any pass, no counter is older than a grant read with it.
// So no swap names a grant that had ended before this pass read it.
//
// An unnamed grant still at the version listed is ended as planned. One
// whose cached copy is out of date (its owner's release, or the status
// another replica wrote when it swapped the counter, is not cached yet)
// is left alone: the pass writes nothing for it and asks for a pass after
// cacheCatchUp, which decides on the cache once it has caught up. So a
// grant its owner released is never ended Expired on a copy from before
// the release, nor a live grant on a copy from before its swap.
//
// Each round gathers, decides (grantplan.Decide), then confirms what it
// decided on (listDirect once, then confirm).
func (r *Reconciler) decide(ctx context.Context, req reconcile.Request, mode readMode) (scope, grantplan.Plan, error) {
	rd := &directReads{fresher: map[types.UID]*lockingv1alpha1.LockGrant{}, confirmed: map[types.UID]string{}}
	for range maxConfirmRounds {
		f, err := r.gather(ctx, req, mode)
		if err != nil || f.Resource == "" {
			return f, grantplan.Plan{}, err
		}
		for uid, g := range rd.fresher {
			f.Grants = grantplan.WithHolder(f.Grants, &lockingv1alpha1.FenceHolder{UID: string(uid)}, g)
		}
		p := grantplan.Decide(f.Facts)
		if !rd.listed && len(grantplan.NewlyHeld(f.Facts, p)) > 0 &&
			(!grantplan.CacheCovers(f.Facts, r.grantsSeen.get()) || grantplan.MayHideLateHeld(f.Facts, p)) {
			// A Held status for a grant not Held before: no other grant
			// may still be Held as stored, which a cache that is behind
			// the counters can hide (a status another replica wrote
			// before its swap), and so can a Held that landed after a
			// swap, on a grant the plan ends or skips over. One direct
			// list of the resource's grants finds it.
			rd.listed = true
			directLists.Inc()
			stale, err := r.listDirect(ctx, req.Namespace, f.Facts, rd.fresher, rd.confirmed)
			if err != nil {
				return f, grantplan.Plan{}, err
			}
			if stale {
				// Decided again with the counters read directly after
				// the list: no counter older than a grant read with it.
				staleGrants.Inc()
				mode = directCounters
				continue
			}
		}
		stale, err := r.confirm(ctx, f.Facts, p, rd)
		if err != nil {
			return f, grantplan.Plan{}, err
		}
		if !stale {
			return f, held(p, rd.behind), nil
		}
	}
	return scope{}, grantplan.Plan{}, errCacheBehind
}

// directReads is what the rounds of one pass learned by reading its grants
// directly.
type directReads struct {
	// fresher are the grants found out of date, by UID, with their fresh
	// copies (nil: gone), which replace the cached ones from then on.
	fresher map[types.UID]*lockingv1alpha1.LockGrant
	// confirmed are the grants found as listed, with the resourceVersion
	// of the copy decided on.
	confirmed map[types.UID]string
	// behind are the unnamed grants whose cached copy is out of date.
	behind []types.UID
	// listed says the resource's grants were listed directly once.
	listed bool
}

// confirm reads directly the grants p makes new holders or ends while no
// counter names them (grantplan.NewHolders, grantplan.EndsUnnamed), but
// those confirmed at the version decided on and those known to be behind.
// It reports whether one p would write was out of date, so that the pass
// decides again on its fresh copy.
func (r *Reconciler) confirm(ctx context.Context, f grantplan.Facts, p grantplan.Plan, rd *directReads) (bool, error) {
	var toRead []lockingv1alpha1.LockGrant
	unnamed := map[types.UID]bool{}
	want := func(uid types.UID) {
		i := slices.IndexFunc(f.Grants, func(g lockingv1alpha1.LockGrant) bool { return g.UID == uid })
		if i >= 0 && rd.confirmed[uid] != f.Grants[i].ResourceVersion && !slices.Contains(rd.behind, uid) {
			toRead = append(toRead, f.Grants[i])
		}
	}
	for _, uid := range grantplan.NewHolders(f, p) {
		want(uid)
	}
	for _, uid := range grantplan.EndsUnnamed(f, p) {
		unnamed[uid] = true
		want(uid)
	}
	if len(toRead) == 0 {
		return false, nil
	}
	fresh := make([]*lockingv1alpha1.LockGrant, len(toRead))
	var reads errgroup.Group
	for i := range toRead {
		reads.Go(func() error {
			g := &lockingv1alpha1.LockGrant{}
			switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(&toRead[i]), g); {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				return fmt.Errorf("reading grant %s before deciding on it: %w", toRead[i].Name, err)
			}
			fresh[i] = g
			return nil
		})
	}
	if err := reads.Wait(); err != nil {
		return false, err
	}
	stale := false
	for i := range toRead {
		listed := &toRead[i]
		g := fresh[i]
		if g != nil && g.UID == listed.UID && (g.ResourceVersion == listed.ResourceVersion || r.own.wrote(g.UID, g.ResourceVersion)) {
			// As listed, or behind it only by this replica's own
			// status write, which the listed copy already shows.
			rd.confirmed[listed.UID] = listed.ResourceVersion
			continue
		}
		staleGrants.Inc()
		if unnamed[listed.UID] {
			rd.behind = append(rd.behind, listed.UID)
			continue
		}
		stale = true
		switch {
		case g != nil && g.UID != listed.UID:
			g = nil // another grant took the name: this one is gone
		case g != nil:
			g = r.own.overlay(g)
		}
		rd.fresher[listed.UID] = g
	}
	return stale, nil
}

// listDirect lists the resource's grants directly from the API server and
// records in fresher every one the pass gathered out of date: changed
// since the cache saw it (other than by this replica's own status write),
// missing from the cache, or gone. The others are confirmed as gathered
// (the grant about to be granted among them: it needs no read of its
// own). It reports whether it found one out of date.
func (r *Reconciler) listDirect(ctx context.Context, ns string, f grantplan.Facts, fresher map[types.UID]*lockingv1alpha1.LockGrant, confirmed map[types.UID]string) (bool, error) {
	var list lockingv1alpha1.LockGrantList
	err := r.APIReader.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{ResourceField: f.Resource})
	if apierrors.IsBadRequest(err) {
		// A LockGrant CRD older than this manager (during an upgrade)
		// selects on no field: list the namespace.
		err = r.APIReader.List(ctx, &list, client.InNamespace(ns))
	}
	if err != nil {
		return false, fmt.Errorf("listing grants before granting: %w", err)
	}
	stale := false
	stored := map[types.UID]bool{}
	for i := range list.Items {
		g := &list.Items[i]
		if g.Spec.Resource != f.Resource {
			continue
		}
		stored[g.UID] = true
		j := slices.IndexFunc(f.Grants, func(c lockingv1alpha1.LockGrant) bool { return c.UID == g.UID })
		if j >= 0 && (f.Grants[j].ResourceVersion == g.ResourceVersion || r.own.wrote(g.UID, g.ResourceVersion)) {
			confirmed[g.UID] = f.Grants[j].ResourceVersion
			continue
		}
		stale = true
		fresher[g.UID] = r.own.overlay(g)
	}
	for i := range f.Grants {
		if uid := f.Grants[i].UID; !stored[uid] {
			stale = true
			fresher[uid] = nil
		}
	}
	return stale, nil
}

// held returns p without the statuses of the grants behind, which it
// ended on cached copies that are out of date, and with a pass after
// cacheCatchUp to decide them on the cache once it has caught up.
func held(p grantplan.Plan, behind []types.UID) grantplan.Plan {
	if len(behind) == 0 {
		return p
	}
	unnamedBehind.Add(float64(len(behind)))
	p = grantplan.Without(p, behind)
	if p.RequeueAfter == 0 || p.RequeueAfter > cacheCatchUp {
		p.RequeueAfter = cacheCatchUp
	}
	return p
}

// slotsWanted lists the slots, 1 and above, whose counters a pass over
// grants reads: every slot below the largest permits a live grant names,
// and every slot a live grant's status names. An exclusive lock has none.
func slotsWanted(grants []lockingv1alpha1.LockGrant) []int32 {
	want := map[int32]bool{}
	for i := range grants {
		g := &grants[i]
		if g.Status.Phase.Final() {
			continue
		}
		for k := int32(1); k < min(g.Spec.EffectivePermits(), lockingv1alpha1.MaxPermits); k++ {
			want[k] = true
		}
		if k := g.HeldSlot(); k > 0 && k < lockingv1alpha1.MaxPermits {
			want[k] = true
		}
	}
	return slices.Sorted(maps.Keys(want))
}

// gatherSlots reads the counters of slots 1 and above of a resource with
// permits (slotsWanted), as mode says, like slot 0's, with their holders.
func (r *Reconciler) gatherSlots(ctx context.Context, mode readMode, f *grantplan.Facts, ns string) error {
	slots := slotsWanted(f.Grants)
	if len(slots) == 0 {
		return nil
	}
	// The counters are read at once, like slot 0's counter and the grant
	// in admission (facts.ReadRegistry): a resource with N permits costs
	// one round trip more, not N-1.
	read := make([]*lockingv1alpha1.FenceCounter, len(slots))
	var reads errgroup.Group
	for i, k := range slots {
		reads.Go(func() error {
			key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(lockingv1alpha1.SlotResource(f.Resource, k))}
			c, err := r.readCounter(ctx, key, mode, f.Now)
			if err != nil {
				return fmt.Errorf("reading fence counter of permit %d: %w", k, err)
			}
			read[i] = c
			return nil
		})
	}
	if err := reads.Wait(); err != nil {
		return err
	}
	f.SlotCounters = make(map[int32]*lockingv1alpha1.FenceCounter, len(slots))
	for i, c := range read {
		if c == nil {
			continue
		}
		f.SlotCounters[slots[i]] = c
		if h := c.Spec.Holder; h != nil {
			if err := r.refreshHolder(ctx, mode, f, ns, h); err != nil {
				return err
			}
		}
	}
	return nil
}

// counterAhead reports whether a counter of f records a fence of a later
// issuer epoch than epoch.
func counterAhead(f grantplan.Facts, epoch int64) bool {
	if f.Counter != nil && fencing.EpochOf(f.Counter.Spec.Fence) > epoch {
		return true
	}
	for _, c := range f.SlotCounters {
		if fencing.EpochOf(c.Spec.Fence) > epoch {
			return true
		}
	}
	return false
}

// policies reads the GuardPolicies the grants name, from the cache.
func (r *Reconciler) policies(ctx context.Context, grants []lockingv1alpha1.LockGrant) (map[string]*lockingv1alpha1.GuardPolicy, error) {
	out := map[string]*lockingv1alpha1.GuardPolicy{}
	for i := range grants {
		name := grants[i].Spec.Policy
		if name == "" {
			continue
		}
		if _, seen := out[name]; seen {
			continue
		}
		pol := &lockingv1alpha1.GuardPolicy{}
		switch err := r.Client.Get(ctx, types.NamespacedName{Name: name}, pol); {
		case apierrors.IsNotFound(err):
			pol = nil
		case err != nil:
			return nil, fmt.Errorf("reading GuardPolicy %q: %w", name, err)
		}
		out[name] = pol
	}
	return out, nil
}

// refreshHolder replaces the holder's cached copy with a direct read when
// the cache may mislead the decision about it (grantplan.HolderReadNeeded),
// with this replica's own status in place while it is not written yet.
// A live holder the cache has, the common case, costs no read. In
// cacheOnly mode the "direct" read is the cache's.
func (r *Reconciler) refreshHolder(ctx context.Context, mode readMode, f *grantplan.Facts, ns string, h *lockingv1alpha1.FenceHolder) error {
	if !grantplan.HolderReadNeeded(f.Grants, h, f.Now) {
		return nil
	}
	reader := r.APIReader
	if mode == cacheOnly {
		reader = r.Client
	}
	fresh := &lockingv1alpha1.LockGrant{}
	switch err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: h.Name}, fresh); {
	case apierrors.IsNotFound(err):
		fresh = nil
	case err != nil:
		return fmt.Errorf("reading holder grant: %w", err)
	default:
		fresh = r.own.overlay(fresh)
	}
	f.Grants = grantplan.WithHolder(f.Grants, h, fresh)
	return nil
}

// counterOf is the counter of slot k as gathered.
func counterOf(f grantplan.Facts, k int32) *lockingv1alpha1.FenceCounter {
	if k == 0 {
		return f.Counter
	}
	return f.SlotCounters[k]
}

// writeCounters applies the plan's counter writes, each by
// compare-and-swap (writeCounter), in grantplan.CounterWrites' order. It
// returns each slot's counter after the write, or as read.
func (r *Reconciler) writeCounters(ctx context.Context, ns string, f grantplan.Facts, p grantplan.Plan) (map[int32]*lockingv1alpha1.FenceCounter, error) {
	counters := map[int32]*lockingv1alpha1.FenceCounter{}
	if f.Counter != nil {
		counters[0] = f.Counter
	}
	for k, c := range f.SlotCounters {
		counters[k] = c
	}
	for _, w := range grantplan.CounterWrites(f, p) {
		key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(w.Spec.Resource)}
		c, err := r.writeCounter(ctx, key, counterOf(f, w.Slot), w.Spec)
		if err != nil {
			return nil, err
		}
		counters[w.Slot] = c
	}
	return counters, nil
}

// writeCounter applies the counter's new spec by compare-and-swap: an
// update carries the resourceVersion it was decided on, so a concurrent
// writer (or a cache that was behind) makes it fail with Conflict and the
// whole pass is decided again. It returns the counter as written: its
// resourceVersion is the backend revision of grants issued in this pass,
// its generation what their statuses were decided on.
func (r *Reconciler) writeCounter(ctx context.Context, key types.NamespacedName, cur *lockingv1alpha1.FenceCounter, spec *lockingv1alpha1.FenceCounterSpec) (*lockingv1alpha1.FenceCounter, error) {
	next := &lockingv1alpha1.FenceCounter{ObjectMeta: ctrlObjectMeta(reconcile.Request{NamespacedName: key})}
	replaced := ""
	if cur != nil {
		next = cur.DeepCopy()
		replaced = cur.ResourceVersion
	}
	next.Spec = *spec
	r.own.writingCounter(key, replaced, r.Clock.Now())
	var err error
	if cur == nil {
		if err = r.Client.Create(ctx, next); apierrors.IsAlreadyExists(err) {
			// Someone created it since it was read: decide again.
			err = apierrors.NewConflict(lockingv1alpha1.GroupVersion.WithResource("fencecounters").GroupResource(), key.Name, err)
		}
	} else {
		err = r.Client.Update(ctx, next)
	}
	if err != nil {
		r.own.wroteCounter(key, nil, r.Clock.Now())
		if apierrors.IsConflict(err) {
			return nil, err
		}
		return nil, fmt.Errorf("writing fence counter: %w", err)
	}
	r.own.wroteCounter(key, next, r.Clock.Now())
	return next, nil
}

// writeStatuses hands the plan's statuses, in its order (the ended
// holders, the new holders, the rest), to the status writer, which writes
// them after this pass (statuses.go). A Reconciler not set up with a
// manager writes them here, in the same order, each once the one before
// it succeeded; the first refused stops them.
func (r *Reconciler) writeStatuses(ctx context.Context, resource types.NamespacedName, p grantplan.Plan) error {
	if r.statuses != nil {
		return r.statuses.enqueue(ctx, resource, p.Statuses, p.Events)
	}
	for _, g := range p.Statuses {
		if err := r.patchStatus(ctx, g); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		r.emit(ctx, g, p.Events)
	}
	return nil
}

// deleteFinished deletes finished grants past their retention, each with a
// UID and resourceVersion precondition so that only the decided-on version
// goes.
func (r *Reconciler) deleteFinished(ctx context.Context, p grantplan.Plan) error {
	deletes, err := r.recordSpent(ctx, p.Deletes)
	if err != nil {
		return err
	}
	for _, g := range deletes {
		uid, rv := g.UID, g.ResourceVersion
		err := r.Client.Delete(ctx, g, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting finished grant %s: %w", g.Name, err)
		}
	}
	return nil
}

// emit counts one grant's transitions in the metric and sends a Kubernetes
// Event for the exceptional ones (expiry, revocation, a lapsed session, a
// refused renew...), once its status write succeeded: a transition that was
// not written is decided again, and announced then. Granted, Renewed and
// Released are the grant path's every step: each would cost an API write
// per acquisition, and the grant's status and conditions already say them.
// An Event the operator must act on at the issuer (a grant held back until
// the epoch is raised) is sent regarding the FenceIssuer too.
func (r *Reconciler) emit(ctx context.Context, g *lockingv1alpha1.LockGrant, events []grantplan.Event) {
	for _, e := range events {
		if e.Grant.UID != g.UID {
			continue
		}
		transitions.WithLabelValues(fencing.CodeOf(e.Reason)).Inc()
		if r.Recorder == nil || !e.Warning {
			continue
		}
		r.Recorder.Eventf(e.Grant, nil, corev1.EventTypeWarning, e.Reason, e.Reason, "%s", e.Note)
		if !e.Issuer {
			continue
		}
		iss := &lockingv1alpha1.FenceIssuer{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: lockingv1alpha1.DefaultFenceIssuerName}, iss); err != nil {
			logf.FromContext(ctx).Error(err, "Reading the FenceIssuer for an Event")
			continue
		}
		r.Recorder.Eventf(iss, e.Grant, corev1.EventTypeWarning, e.Reason, e.Reason, "LockGrant %s/%s: %s", e.Grant.Namespace, e.Grant.Name, e.Note)
	}
}

// transitions counts grant transitions by reason, the same reasons as the
// Events and conditions.
var transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "lockwarden_grant_transitions_total",
	Help: "LockGrant transitions (Granted, Renewed, RELEASED, EXPIRED, TIMED_OUT, REVOKED_EPOCH, PolicyDenied, FENCE_REGRESSION, ...), by reason: the reason code of the catalog when there is one.",
}, []string{"reason"})

// directLists counts the passes that listed their resource's grants
// directly before a Held status, because the grants cache had not shown
// every change up to the counters' versions (grantplan.CacheCovers) or the
// plan may rest on a late Held (grantplan.MayHideLateHeld).
var directLists = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_direct_lists_total",
	Help: "Passes that listed their resource's grants directly from the API server before writing a Held status, because the grants cache had not yet shown every change up to the counters' versions, or the plan ended or skipped a grant whose Held status may have landed after them.",
})

// staleGrants counts grants a pass was about to grant, or to end while no
// counter names them, whose cached copy was out of date.
var staleGrants = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_cache_stale_total",
	Help: "Grants a pass was about to grant, or to end as Held grants no counter names, whose cached copy was out of date (released, withdrawn, deleted or changed since the cache saw it); the pass decided again on a direct read, or left the grant for a pass on the caught-up cache.",
})

// unnamedBehind counts the grants a pass would have ended, as Held grants
// no counter names, on a cached copy that was out of date: it wrote
// nothing for them.
var unnamedBehind = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_unnamed_end_deferred_total",
	Help: "Grants a pass would have ended as Held grants no FenceCounter names, on a cached copy that was out of date (a release or another replica's status not cached yet); the pass wrote nothing for them and decided them again once the cache caught up.",
})

// counterConflicts counts the passes whose counter compare-and-swap
// conflicted and that were decided again on a direct read.
var counterConflicts = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_counter_conflicts_total",
	Help: "Passes whose FenceCounter compare-and-swap conflicted (the counter had moved since the pass read it, from the cache or directly); each was decided again at once on a direct read.",
})

// statusesRedecided counts the passes decided again because statuses of
// their resource were dropped while they decided.
var statusesRedecided = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_statuses_redecided_total",
	Help: "Passes whose statuses were not queued because a status write of the same resource failed while they decided (they may have decided on the dropped plans); each was decided again at once.",
})

// selfEvents counts the counter watch events of this replica's own
// compare-and-swaps, which start no pass.
var selfEvents = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_own_counter_events_total",
	Help: "FenceCounter watch events that were this replica's own compare-and-swap, or moved the counter off the version such a write in flight was conditional on; they start no pass.",
})

func init() {
	metrics.Registry.MustRegister(transitions, staleGrants, unnamedBehind, counterConflicts, statusesRedecided, selfEvents, directLists)
}
