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
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// CounterNameField indexes LockGrants by the name of their resource's
// FenceCounter, so that one resource's grants are listed from the cache.
const CounterNameField = "spec.resource.counterName"

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
	// APIReader reads the counter and the holder grant directly from the
	// API server before a compare-and-swap.
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
	// compare-and-swap and the resourceVersion preconditions on every
	// status write serialize replicas (docs/ha.md), so a replica that dies
	// costs no failover wait. nil keeps controller-runtime's default (only
	// the leader runs it).
	NeedLeaderElection *bool
	// Ownership, when set, leaves each resource to its preferred replica
	// for a takeover delay (ownership.go); nil acts on every event at once.
	Ownership *Ownership

	// sessionsSeen holds the controller's observations of session Leases.
	sessionsSeen sessionTracker
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
	return ctrl.NewControllerManagedBy(mgr).
		Named("lockgrant").
		For(&lockingv1alpha1.FenceCounter{}, builder.WithPredicates(predicate.GenerationChangedPredicate{}, predicate.NewPredicateFuncs(isSlotZero))).
		// The counters of the other slots of a resource with permits are
		// decided with their resource, under slot 0's counter name.
		Watches(&lockingv1alpha1.FenceCounter{}, handler.EnqueueRequestsFromMapFunc(resourceOfCounter),
			builder.WithPredicates(predicate.GenerationChangedPredicate{}, predicate.Not(predicate.NewPredicateFuncs(isSlotZero)))).
		// Grants: creation, deletion, and changes of spec (renew, release)
		// or annotations (a reported fence regression). Status changes are
		// this controller's own writes and need no second pass.
		Watches(&lockingv1alpha1.LockGrant{}, handler.EnqueueRequestsFromMapFunc(resourceOf),
			builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
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
	for i := range list.Items {
		if isSlotZero(&list.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
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
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if res, left := r.leaveToPreferred(ctx, req); left {
		return res, nil // another replica is preferred for it (ownership.go)
	}
	var p grantplan.Plan
	var params issuer.Params
	var revisions map[int32]string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		f, plan, err := r.decide(ctx, req)
		p = plan
		if err != nil || f.Resource == "" {
			p = grantplan.Plan{}
			return err
		}
		params = f.Params
		revisions, err = r.writeCounters(ctx, req.Namespace, f, p)
		return err
	})
	if errors.Is(err, errCacheBehind) {
		logf.FromContext(ctx).V(1).Info("Grants cache behind the API server; deciding again once it caught up")
		return reconcile.Result{RequeueAfter: cacheCatchUp}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	grantplan.SignSlots(p, params, func(k int32) string { return revisions[k] })
	if err := r.writeStatuses(ctx, p); err != nil {
		if apierrors.IsConflict(err) {
			// A grant changed under us (a renew, a release): decide
			// again on fresh facts, without an error in the log.
			logf.FromContext(ctx).V(1).Info("Status write conflicted; deciding again", "error", err.Error())
			return reconcile.Result{RequeueAfter: time.Millisecond}, nil
		}
		return reconcile.Result{}, err
	}
	if err := r.deleteFinished(ctx, p); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: p.RequeueAfter}, nil
}

// gather reads what decide needs: the resource's grants from the cache, and
// the counter directly from the API server. The counter carries its
// holder's live lease (spec.holder.expiresAt), so the holder's expiry is
// judged on that one fresh read, and every change of the holder or its
// lease is a compare-and-swap on it. The grants are read before the
// counter, so the counter is never older than a status read with it (a
// status is written after its counter). The holder grant is read directly
// too only when the cache may mislead (refreshHolder): it is missing, its
// lease is over, or the counter predates the lease it now carries.
// reader is that direct reader (the cache, for ownership's check only).
func (r *Reconciler) gather(ctx context.Context, req reconcile.Request, reader client.Reader) (grantplan.Facts, error) {
	f := grantplan.Facts{Retention: r.FinishedGrantRetention}
	var list lockingv1alpha1.LockGrantList
	if err := r.Client.List(ctx, &list, client.InNamespace(req.Namespace), client.MatchingFields{CounterNameField: req.Name}); err != nil {
		return f, fmt.Errorf("listing grants: %w", err)
	}
	f.Grants = list.Items
	// The clock is read after the grants: every create and renew the pass
	// acts on was then sent before Now, so a lease the pass starts or
	// extends from Now lasts at least its TTL from the send time the
	// holder counts its deadline from (pkg/lock/holder), however long
	// this process pauses between reading the clock and the grants.
	f.Now = r.Clock.Now()

	counter := &lockingv1alpha1.FenceCounter{}
	switch err := reader.Get(ctx, req.NamespacedName, counter); {
	case apierrors.IsNotFound(err):
		counter = nil
	case err != nil:
		return f, fmt.Errorf("reading fence counter: %w", err)
	}
	f.Counter = counter

	if counter != nil {
		if _, k, _ := lockingv1alpha1.ParseSlotResource(counter.Spec.Resource); k > 0 {
			// Another slot's counter: its resource's pass decides it.
			return grantplan.Facts{}, nil
		}
		f.Resource = counter.Spec.Resource
		if h := counter.Spec.Holder; h != nil {
			if err := r.refreshHolder(ctx, reader, &f, req.Namespace, h); err != nil {
				return f, err
			}
		}
	} else if len(f.Grants) > 0 {
		f.Resource = f.Grants[0].Spec.Resource
	}
	if len(f.Grants) == 0 {
		return f, nil // at most a stale holder to clear; no issuing
	}
	if err := r.gatherSlots(ctx, reader, &f, req.Namespace); err != nil {
		return f, err
	}
	params, err := r.Keyring.Params(ctx)
	if err != nil {
		return f, err
	}
	if r.FreshKeyring != nil && counterAhead(f, params.Epoch) {
		if params, err = r.FreshKeyring.Params(ctx); err != nil {
			return f, err
		}
	}
	f.Params, f.Epoch, f.Revoked = params, params.Epoch, params.Revoked
	if f.Policies, err = r.policies(ctx, f.Grants); err != nil {
		return f, err
	}
	if f.Sessions, err = r.sessions(ctx, req.Namespace, f.Grants, f.Now); err != nil {
		return f, err
	}
	return f, nil
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

// decide gathers and plans the pass. Before a counter's swap names a new
// holder, that grant is read directly (newHolders), after the counter: if
// it is still the version the pass listed, the pass rests on its current
// state. A cached copy that is out of date (the grant was released,
// withdrawn, deleted, or changed since the cache last saw it: a replica
// resumed after a freeze, a watch that lagged) is replaced by the fresh
// one, and the pass is gathered and decided again: the counters are read
// again too, so that, as in any pass, no counter is older than a grant
// read with it. So no swap names a grant that had ended before this pass
// read it: the read a grant rests on is as fresh as the counter's,
// whatever the cache's lag.
func (r *Reconciler) decide(ctx context.Context, req reconcile.Request) (grantplan.Facts, grantplan.Plan, error) {
	fresher := map[types.UID]*lockingv1alpha1.LockGrant{}
	confirmed := map[types.UID]string{}
	for range maxConfirmRounds {
		f, err := r.gather(ctx, req, r.APIReader)
		if err != nil || f.Resource == "" {
			return f, grantplan.Plan{}, err
		}
		for uid, g := range fresher {
			f.Grants = grantplan.WithHolder(f.Grants, &lockingv1alpha1.FenceHolder{UID: string(uid)}, g)
		}
		p := grantplan.Decide(f)
		var toRead []lockingv1alpha1.LockGrant
		for _, uid := range newHolders(f, p) {
			i := slices.IndexFunc(f.Grants, func(g lockingv1alpha1.LockGrant) bool { return g.UID == uid })
			if i >= 0 && confirmed[uid] != f.Grants[i].ResourceVersion {
				toRead = append(toRead, f.Grants[i])
			}
		}
		if len(toRead) == 0 {
			return f, p, nil
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
					return fmt.Errorf("reading grant %s before granting it: %w", toRead[i].Name, err)
				}
				fresh[i] = g
				return nil
			})
		}
		if err := reads.Wait(); err != nil {
			return f, grantplan.Plan{}, err
		}
		stale := false
		for i := range toRead {
			listed := &toRead[i]
			g := fresh[i]
			if g != nil && g.UID == listed.UID && g.ResourceVersion == listed.ResourceVersion {
				confirmed[listed.UID] = listed.ResourceVersion
				continue
			}
			stale = true
			staleGrants.Inc()
			if g != nil && g.UID != listed.UID {
				g = nil // another grant took the name: this one is gone
			}
			fresher[listed.UID] = g
		}
		if !stale {
			return f, p, nil
		}
	}
	return grantplan.Facts{}, grantplan.Plan{}, errCacheBehind
}

// newHolders lists the grants p's counter writes name as a new holder:
// those the pass grants.
func newHolders(f grantplan.Facts, p grantplan.Plan) []types.UID {
	var uids []types.UID
	for _, w := range grantplan.CounterWrites(f, p) {
		cur := counterOf(f, w.Slot)
		if h := w.Spec.Holder; h != nil && (cur == nil || cur.Spec.Holder == nil || cur.Spec.Holder.UID != h.UID) {
			uids = append(uids, types.UID(h.UID))
		}
	}
	return uids
}

// gatherSlots reads the counters of slots 1 and above of a resource with
// permits, directly like slot 0's, with their holders: every slot below the
// largest permits a live grant names, and every slot a live grant's status
// names. An exclusive lock reads none.
func (r *Reconciler) gatherSlots(ctx context.Context, reader client.Reader, f *grantplan.Facts, ns string) error {
	want := map[int32]bool{}
	for i := range f.Grants {
		g := &f.Grants[i]
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
	if len(want) == 0 {
		return nil
	}
	// The counters are read at once, like slot 0's counter and the grant
	// in admission (facts.ReadRegistry): a resource with N permits costs
	// one round trip more, not N-1.
	slotsWanted := slices.Sorted(maps.Keys(want))
	read := make([]*lockingv1alpha1.FenceCounter, len(slotsWanted))
	var reads errgroup.Group
	for i, k := range slotsWanted {
		reads.Go(func() error {
			c := &lockingv1alpha1.FenceCounter{}
			key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(lockingv1alpha1.SlotResource(f.Resource, k))}
			switch err := reader.Get(ctx, key, c); {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				return fmt.Errorf("reading fence counter of permit %d: %w", k, err)
			}
			read[i] = c
			return nil
		})
	}
	if err := reads.Wait(); err != nil {
		return err
	}
	f.SlotCounters = make(map[int32]*lockingv1alpha1.FenceCounter, len(want))
	for i, c := range read {
		if c == nil {
			continue
		}
		f.SlotCounters[slotsWanted[i]] = c
		if h := c.Spec.Holder; h != nil {
			if err := r.refreshHolder(ctx, reader, f, ns, h); err != nil {
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
// the cache may mislead the decision about it (grantplan.HolderReadNeeded).
// A live holder the cache has, the common case, costs no read.
func (r *Reconciler) refreshHolder(ctx context.Context, reader client.Reader, f *grantplan.Facts, ns string, h *lockingv1alpha1.FenceHolder) error {
	if !grantplan.HolderReadNeeded(f.Grants, h, f.Now) {
		return nil
	}
	fresh := &lockingv1alpha1.LockGrant{}
	switch err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: h.Name}, fresh); {
	case apierrors.IsNotFound(err):
		fresh = nil
	case err != nil:
		return fmt.Errorf("reading holder grant: %w", err)
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
// returns each slot's counter resourceVersion after the write or as read.
func (r *Reconciler) writeCounters(ctx context.Context, ns string, f grantplan.Facts, p grantplan.Plan) (map[int32]string, error) {
	revs := map[int32]string{}
	if f.Counter != nil {
		revs[0] = f.Counter.ResourceVersion
	}
	for k, c := range f.SlotCounters {
		revs[k] = c.ResourceVersion
	}
	for _, w := range grantplan.CounterWrites(f, p) {
		key := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(w.Spec.Resource)}}
		rev, err := r.writeCounter(ctx, key, counterOf(f, w.Slot), w.Spec)
		if err != nil {
			return nil, err
		}
		revs[w.Slot] = rev
	}
	return revs, nil
}

// writeCounter applies the counter's new spec by compare-and-swap: an update
// carries the resourceVersion read in gather, so a concurrent writer makes it
// fail with Conflict and the whole pass is gathered again.
//
// It returns the counter's resourceVersion after the write (or as read,
// when nothing changes): the backend revision of grants issued in this pass.
func (r *Reconciler) writeCounter(ctx context.Context, req reconcile.Request, cur *lockingv1alpha1.FenceCounter, spec *lockingv1alpha1.FenceCounterSpec) (string, error) {
	if spec == nil {
		if cur == nil {
			return "", nil
		}
		return cur.ResourceVersion, nil
	}
	if cur == nil {
		c := &lockingv1alpha1.FenceCounter{
			ObjectMeta: ctrlObjectMeta(req),
			Spec:       *spec,
		}
		if err := r.Client.Create(ctx, c); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Someone created it since we looked: gather again.
				return "", apierrors.NewConflict(lockingv1alpha1.GroupVersion.WithResource("fencecounters").GroupResource(), req.Name, err)
			}
			return "", fmt.Errorf("creating fence counter: %w", err)
		}
		return c.ResourceVersion, nil
	}
	next := cur.DeepCopy()
	next.Spec = *spec
	if err := r.Client.Update(ctx, next); err != nil {
		if apierrors.IsConflict(err) {
			return "", err
		}
		return "", fmt.Errorf("updating fence counter: %w", err)
	}
	return next.ResourceVersion, nil
}

// writeStatuses writes each changed status once, after the counters, in the
// plan's order: the ended holders, the new holders, the rest. Each update
// carries the resourceVersion it was decided on; the first Conflict stops
// the writes and requeues the resource, and the next pass converges on the
// counter, which already says who holds.
func (r *Reconciler) writeStatuses(ctx context.Context, p grantplan.Plan) error {
	for _, g := range p.Statuses {
		if err := r.Client.Status().Update(ctx, g); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("writing status of grant %s: %w", g.Name, err)
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

// staleGrants counts grants a pass was about to grant whose cached copy was
// out of date.
var staleGrants = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "lockwarden_grant_cache_stale_total",
	Help: "Grants a pass was about to grant whose cached copy was out of date (released, withdrawn, deleted or changed since the cache saw it); the pass decided again on a direct read.",
})

func init() { metrics.Registry.MustRegister(transitions, staleGrants) }
