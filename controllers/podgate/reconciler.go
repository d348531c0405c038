package podgate

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/podgate"
	"github.com/lockwarden/lockwarden/internal/replicacache"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// PodField indexes LockGrants by the name of the Pod they were requested
// for (their controller reference to a Pod).
const PodField = "metadata.ownerReferences.pod"

// LockField indexes gated Pods by namespace and lock ("NAMESPACE/LOCK").
const LockField = "metadata.annotations.lock"

// NodeLeaseNamespace holds the nodes' heartbeat Leases.
const NodeLeaseNamespace = corev1.NamespaceNodeLease

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=patch
// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=lockgrants,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconciler gates Pods on their grants; see the package doc.
type Reconciler struct {
	// Client writes, and reads LockGrants from the manager's cache.
	Client client.Client
	// Pods reads gated Pods (labeled locking.lockwarden.io/gated=true)
	// from a cache of those only; SetupWithManager creates it when nil.
	Pods client.Reader
	// APIReader reads directly from the API server: a Pod or grant the
	// caches do not show before a decision that would end it, and node
	// Leases.
	APIReader client.Reader
	// Clock is the controller's clock, the one every lease is judged by.
	Clock clock.PassiveClock
	// Recorder sends the Pods' Events.
	Recorder events.EventRecorder
	// NeedLeaderElection, when false, runs the controller on every
	// replica (see lockgrant.Reconciler.NeedLeaderElection).
	NeedLeaderElection *bool

	// heartbeats holds the controller's observations of node Leases.
	heartbeats heartbeats
}

// SetupWithManager registers the controller, its cache of gated Pods and
// the grants' Pod index.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	pods, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		// Only the Pods admission gated: never every Pod of the cluster.
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{lockingv1alpha1.GatedLabel: "true"})},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
	})
	if err != nil {
		return fmt.Errorf("creating the gated Pod cache: %w", err)
	}
	if err := pods.IndexField(ctx, &corev1.Pod{}, LockField, func(o client.Object) []string {
		if l, ok := o.GetAnnotations()[lockingv1alpha1.LockAnnotation]; ok {
			return []string{o.GetNamespace() + "/" + l}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing gated Pods by lock: %w", err)
	}
	// The controller runs on every replica, and so must its cache: a
	// leader-only cache would stop every other replica after the cache
	// sync timeout.
	if err := mgr.Add(replicacache.Of(pods)); err != nil {
		return err
	}
	if r.Pods == nil {
		r.Pods = pods
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &lockingv1alpha1.LockGrant{}, PodField, func(o client.Object) []string {
		if ref := podgate.PodOf(o.(*lockingv1alpha1.LockGrant)); ref != nil {
			return []string{ref.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing lockgrants by Pod: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podgate").
		WatchesRawSource(source.Kind(pods, &corev1.Pod{}, &handler.TypedEnqueueRequestForObject[*corev1.Pod]{})).
		// The grants of Pods: their creation and every change of status
		// (Held, ended, renewed) or spec.
		Watches(&lockingv1alpha1.LockGrant{}, handler.EnqueueRequestsFromMapFunc(podOfGrant),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return podgate.PodOf(o.(*lockingv1alpha1.LockGrant)) != nil
			}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 16, NeedLeaderElection: r.NeedLeaderElection}).
		Complete(r)
}

// podOfGrant maps a grant to the Pod it was requested for.
func podOfGrant(_ context.Context, o client.Object) []reconcile.Request {
	ref := podgate.PodOf(o.(*lockingv1alpha1.LockGrant))
	if ref == nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}}
}

// Reconcile brings one Pod and its grants up to date.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	f, err := r.gather(ctx, req)
	if err != nil {
		return reconcile.Result{}, err
	}
	p := podgate.Decide(f)
	if podgate.Confirm(f, p) {
		// Ending a Pod, or releasing the grant of another Pod of its name,
		// is decided on the API server's versions, never on caches alone
		// (podgate.Confirm): the Pod cache can be ahead of the grant cache
		// or behind it.
		fresh, changed, err := r.confirm(ctx, f)
		if err != nil {
			return reconcile.Result{}, err
		}
		if changed {
			f, p = fresh, podgate.Decide(fresh)
		}
	}
	return r.apply(ctx, f, p)
}

// confirm reads the Pod and its grants directly from the API server and
// returns the facts with them, and whether any differs from the cached
// version decided on.
func (r *Reconciler) confirm(ctx context.Context, f podgate.Facts) (podgate.Facts, bool, error) {
	changed := false
	if f.Pod != nil {
		pod := &corev1.Pod{}
		switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(f.Pod), pod); {
		case apierrors.IsNotFound(err):
			f.Pod, changed = nil, true
		case err != nil:
			return f, false, fmt.Errorf("reading Pod: %w", err)
		case pod.UID != f.Pod.UID || pod.ResourceVersion != f.Pod.ResourceVersion:
			f.Pod, changed = pod, true
		}
	}
	grants := make([]*lockingv1alpha1.LockGrant, 0, len(f.Grants))
	for _, g := range f.Grants {
		cur := &lockingv1alpha1.LockGrant{}
		switch err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(g), cur); {
		case apierrors.IsNotFound(err):
			changed = true
		case err != nil:
			return f, false, fmt.Errorf("reading grant %s: %w", g.Name, err)
		default:
			changed = changed || cur.ResourceVersion != g.ResourceVersion
			grants = append(grants, cur)
		}
	}
	f.Grants = grants
	return f, changed, nil
}

// gather reads what Decide needs. The Pod comes from the gated Pods'
// cache and the grants from the manager's; what the caches do not show is
// confirmed directly before it decides anything: a Pod that seems gone
// while a grant was requested for it, and the grant of a Pod that seems
// to have none. The node's Lease is read directly, only when a renewal is
// due.
func (r *Reconciler) gather(ctx context.Context, req reconcile.Request) (podgate.Facts, error) {
	f := podgate.Facts{Now: r.Clock.Now()}
	pod := &corev1.Pod{}
	switch err := r.Pods.Get(ctx, req.NamespacedName, pod); {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return f, fmt.Errorf("reading Pod: %w", err)
	}
	var list lockingv1alpha1.LockGrantList
	if err := r.Client.List(ctx, &list, client.InNamespace(req.Namespace), client.MatchingFields{PodField: req.Name}); err != nil {
		return f, fmt.Errorf("listing the Pod's grants: %w", err)
	}
	for i := range list.Items {
		f.Grants = append(f.Grants, &list.Items[i])
	}
	if pod == nil && len(f.Grants) > 0 {
		fresh := &corev1.Pod{}
		switch err := r.APIReader.Get(ctx, req.NamespacedName, fresh); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return f, fmt.Errorf("reading Pod: %w", err)
		default:
			pod = fresh
		}
	}
	f.Pod = pod
	if pod == nil {
		return f, nil
	}
	if !hasGrantOf(f.Grants, pod) {
		g := &lockingv1alpha1.LockGrant{}
		name := lockingv1alpha1.GrantNameForRequest(lockingv1alpha1.PodRequestID(string(pod.UID)))
		switch err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: name}, g); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return f, fmt.Errorf("reading the Pod's grant: %w", err)
		default:
			f.Grants = append(f.Grants, g)
		}
	}
	var err error
	f.Request, f.RequestErr = requestOf(pod)
	if !hasGrantOf(f.Grants, pod) && podgate.Gated(pod) && f.RequestErr == nil {
		if f.Ahead, err = r.ahead(ctx, pod); err != nil {
			return f, err
		}
	}
	if podgate.NodeReadNeeded(f) {
		hb, err := r.heartbeat(ctx, pod.Spec.NodeName, f.Now)
		if err != nil {
			return f, err
		}
		f.Node = hb
	}
	return f, nil
}

// ahead returns the gated Pods of pod's lock admitted before it that have
// no grant in the cache yet. A Pod is in the cache only after every Pod
// created before it is, so none of those is missed.
func (r *Reconciler) ahead(ctx context.Context, pod *corev1.Pod) ([]*corev1.Pod, error) {
	var list corev1.PodList
	if err := r.Pods.List(ctx, &list, client.InNamespace(pod.Namespace), client.UnsafeDisableDeepCopy,
		client.MatchingFields{LockField: pod.Namespace + "/" + pod.Annotations[lockingv1alpha1.LockAnnotation]}); err != nil {
		return nil, fmt.Errorf("listing the Pods of lock %s: %w", pod.Annotations[lockingv1alpha1.LockAnnotation], err)
	}
	var out []*corev1.Pod
	for i := range list.Items {
		a := &list.Items[i]
		if a.UID == pod.UID || !podgate.Gated(a) || !podgate.AdmittedBefore(a, pod) {
			continue
		}
		g := &lockingv1alpha1.LockGrant{}
		name := lockingv1alpha1.GrantNameForRequest(lockingv1alpha1.PodRequestID(string(a.UID)))
		switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: a.Namespace, Name: name}, g); {
		case apierrors.IsNotFound(err):
			out = append(out, a.DeepCopy())
		case err != nil:
			return nil, fmt.Errorf("reading the grant of Pod %s: %w", a.Name, err)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		if podgate.AdmittedBefore(a, b) {
			return -1
		}
		return 1
	})
	return out, nil
}

// requestOf parses the Pod's lock request.
func requestOf(pod *corev1.Pod) (podgate.Request, error) {
	r, errs := podgate.ParseRequest(pod.Annotations)
	if len(errs) > 0 {
		return r, errs.ToAggregate()
	}
	return r, nil
}

// hasGrantOf reports whether grants hold one requested for pod (its UID).
func hasGrantOf(grants []*lockingv1alpha1.LockGrant, pod *corev1.Pod) bool {
	for _, g := range grants {
		if ref := podgate.PodOf(g); ref != nil && ref.UID == string(pod.UID) {
			return true
		}
	}
	return false
}

// apply makes the plan's writes in its order, and sends each Event once
// the write it announces succeeded. A Conflict decides again on fresh
// facts.
func (r *Reconciler) apply(ctx context.Context, f podgate.Facts, p podgate.Plan) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	again := reconcile.Result{RequeueAfter: time.Millisecond}
	for _, g := range p.Release {
		if err := r.release(ctx, g); err != nil {
			return reconcile.Result{}, err
		}
		log.V(1).Info("Released the grant of a Pod", "grant", klog.KObj(g), "phase", g.Status.Phase)
	}
	for i, g := range p.Requests {
		own := i == len(p.Requests)-1
		if err := r.request(ctx, f, g, own); err != nil {
			return reconcile.Result{}, err
		}
	}
	if p.Start != nil {
		switch err := r.start(ctx, f.Pod, p.Start); {
		case apierrors.IsConflict(err):
			return again, nil
		case err != nil:
			return reconcile.Result{}, err
		}
	}
	if g := p.Renew; g != nil {
		if err := r.renew(ctx, g); err != nil {
			if apierrors.IsConflict(err) {
				return again, nil
			}
			return reconcile.Result{}, err
		}
	}
	if p.End != nil {
		if err := r.end(ctx, f.Pod, p.End); err != nil {
			return reconcile.Result{}, err
		}
		log.Info("Deleted a Pod whose lock ended", "pod", klog.KObj(f.Pod), "reason", p.End.Reason)
		r.event(f.Pod, nil, corev1.EventTypeWarning, p.End.Reason, "Delete", "%s: deleting the Pod", p.End.Message)
	}
	for _, e := range p.Events {
		r.event(f.Pod, e.Grant, e.Type, e.Reason, e.Reason, "%s", e.Note)
	}
	return reconcile.Result{RequeueAfter: p.RequeueAfter}, nil
}

// request creates grant g, for the Pod or for one ahead of it (own
// false), and announces it on its Pod. A grant that exists already needs
// nothing more. A refusal of the Pod's own grant is said in an Event and
// retried with backoff; one of a Pod ahead is left to that Pod's own pass.
func (r *Reconciler) request(ctx context.Context, f podgate.Facts, g *lockingv1alpha1.LockGrant, own bool) error {
	err := r.Client.Create(ctx, g)
	switch {
	case err == nil:
	case apierrors.IsAlreadyExists(err):
		return nil
	case !own:
		logf.FromContext(ctx).V(1).Info("Requesting the grant of a Pod ahead failed", "grant", klog.KObj(g), "error", err.Error())
		return nil
	case denial.Reason(err) != "" || apierrors.IsInvalid(err):
		r.event(f.Pod, nil, corev1.EventTypeWarning, lockingv1alpha1.GatedPodReasonRequestRefused, "Request", "the lock's grant was refused: %v", err)
		return fmt.Errorf("requesting the Pod's grant: %w", err)
	default:
		return fmt.Errorf("requesting the Pod's grant: %w", err)
	}
	pod := f.Pod
	if !own {
		ref := podgate.PodOf(g)
		pod = nil
		for _, a := range f.Ahead {
			if string(a.UID) == ref.UID {
				pod = a
			}
		}
	}
	r.event(pod, g, corev1.EventTypeNormal, lockingv1alpha1.GatedPodReasonWaiting, "Request", "%s", r.waitingNote(ctx, g))
	return nil
}

// release releases (or withdraws) grant g as its steward; a grant that has
// ended or is gone in the meantime needs nothing more.
func (r *Reconciler) release(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	err := r.patchGrant(ctx, g, "", map[string]any{"release": true})
	switch {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	}
	switch denial.Reason(err) {
	case fencing.ReasonAlreadyEnded, fencing.ReasonExpired, fencing.ReasonRevoked:
		return nil // it ended already
	}
	return fmt.Errorf("releasing grant %s: %w", g.Name, err)
}

// renew raises the grant's spec.renewals by one, on the version decided
// on; a refusal means the grant ended, which its next status says.
func (r *Reconciler) renew(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	err := r.patchGrant(ctx, g, g.ResourceVersion, map[string]any{"renewals": g.Spec.Renewals + 1})
	if err != nil && denial.Reason(err) != "" {
		logf.FromContext(ctx).V(1).Info("Renewal refused", "grant", klog.KObj(g), "error", err.Error())
		return nil
	}
	if err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("renewing grant %s: %w", g.Name, err)
	}
	return err
}

// patchGrant sends a merge patch of g's spec for exactly this grant (its
// UID) and, when rv is set, exactly that version.
func (r *Reconciler) patchGrant(ctx context.Context, g *lockingv1alpha1.LockGrant, rv string, spec map[string]any) error {
	md := map[string]any{"uid": g.UID}
	if rv != "" {
		md["resourceVersion"] = rv
	}
	body, err := json.Marshal(map[string]any{"metadata": md, "spec": spec})
	if err != nil {
		return err
	}
	target := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}
	return r.Client.Patch(ctx, target, client.RawPatch(types.MergePatchType, body))
}

// start writes the grant's annotations onto the Pod and removes its
// scheduling gate, in one write conditional on the Pod's resourceVersion:
// no version of the Pod is ever ungated without its fence.
func (r *Reconciler) start(ctx context.Context, pod *corev1.Pod, annotations map[string]string) error {
	next := pod.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		next.Annotations[k] = v
	}
	gates := next.Spec.SchedulingGates[:0]
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name != lockingv1alpha1.PodSchedulingGate {
			gates = append(gates, g)
		}
	}
	next.Spec.SchedulingGates = gates
	if err := r.Client.Patch(ctx, next, client.MergeFromWithOptions(pod, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("starting Pod %s: %w", klog.KObj(pod), err)
	}
	return nil
}

// end marks the Pod as disrupted (a DisruptionTarget condition, so that a
// Job's podFailurePolicy can tell a lost lock from a failure) and deletes
// it, with its own grace period, exactly this Pod (its UID).
func (r *Reconciler) end(ctx context.Context, pod *corev1.Pod, e *podgate.End) error {
	if pod.DeletionTimestamp != nil {
		return nil
	}
	marked := pod.DeepCopy()
	cond := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: e.Reason,
		Message: e.Message, LastTransitionTime: metav1.NewTime(r.Clock.Now())}
	replaced := false
	for i := range marked.Status.Conditions {
		if marked.Status.Conditions[i].Type == corev1.DisruptionTarget {
			marked.Status.Conditions[i], replaced = cond, true
		}
	}
	if !replaced {
		marked.Status.Conditions = append(marked.Status.Conditions, cond)
	}
	if err := r.Client.Status().Patch(ctx, marked, client.StrategicMergeFrom(pod)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("marking Pod %s as disrupted: %w", klog.KObj(pod), err)
	}
	uid := pod.UID
	if err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting Pod %s: %w", klog.KObj(pod), err)
	}
	return nil
}

// waitingNote says why the Pod's new grant g waits, from the cached
// grants of its resource.
func (r *Reconciler) waitingNote(ctx context.Context, g *lockingv1alpha1.LockGrant) string {
	var list lockingv1alpha1.LockGrantList
	if err := r.Client.List(ctx, &list, client.InNamespace(g.Namespace),
		client.MatchingFields{lockgrant.CounterNameField: lockingv1alpha1.FenceCounterName(g.Spec.Resource)}); err != nil {
		logf.FromContext(ctx).V(1).Info("Listing the resource's grants", "error", err.Error())
	}
	return podgate.WaitingNote(g, list.Items)
}

// event sends an Event about pod, related to grant when not nil.
func (r *Reconciler) event(pod *corev1.Pod, grant *lockingv1alpha1.LockGrant, eventtype, reason, action, note string, args ...any) {
	if r.Recorder == nil || pod == nil {
		return
	}
	if grant != nil {
		r.Recorder.Eventf(pod, grant, eventtype, reason, action, note, args...)
		return
	}
	r.Recorder.Eventf(pod, nil, eventtype, reason, action, note, args...)
}
