package lockgrant

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// SessionField indexes LockGrants by the name of the session Lease they
// name (spec.session.name).
const SessionField = "spec.session.name"

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch

// sessionTracker remembers, for each session Lease, the version the
// controller saw last and when it first saw it, by the controller's clock.
// Liveness is judged from these observations only, never from a time the
// client wrote (spec.renewTime): a client's wall clock may be off by any
// amount. A controller that starts (or takes over) has no observations and
// counts each session from the moment it first sees it.
type sessionTracker struct {
	mu   sync.Mutex
	seen map[types.UID]seenVersion
}

type seenVersion struct {
	resourceVersion string
	at              time.Time
	// period is how long before at the version before was first seen; 0
	// when this is the first version seen.
	period time.Duration
}

// observe records that l was seen at now and returns when its current
// version was first seen, and how long before that the one before.
func (t *sessionTracker) observe(l *coordinationv1.Lease, now time.Time) seenVersion {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil {
		t.seen = map[types.UID]seenVersion{}
	}
	s, ok := t.seen[l.UID]
	if ok && s.resourceVersion == l.ResourceVersion {
		return s
	}
	next := seenVersion{resourceVersion: l.ResourceVersion, at: now}
	if ok {
		next.period = now.Sub(s.at)
	}
	t.seen[l.UID] = next
	return next
}

func (t *sessionTracker) forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.seen, uid)
}

// sessionFacts returns the fencing facts of a session Lease seen at now.
func (t *sessionTracker) sessionFacts(l *coordinationv1.Lease, now time.Time) *fencing.Session {
	seen := t.observe(l, now)
	s := &fencing.Session{UID: string(l.UID), ObservedAt: seen.at, Period: seen.period}
	if l.Spec.HolderIdentity != nil {
		s.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseDurationSeconds != nil {
		s.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return s
}

// isSession reports whether o is a session Lease (labeled as one).
func isSession(o client.Object) bool {
	return o.GetLabels()[lockingv1alpha1.SessionLabel] == "true"
}

// sessions gathers the session Leases that the live grants name. It reads
// them from the cache, and reads directly from the API server any session
// the cache shows as gone, lapsed or overdue (its renewal due and not seen:
// fencing.CheckSessionRenewing, on which the head of the queue is withdrawn
// at its turn) before the decision drops a request on it: a lagging cache
// must never make a live client look dead. A direct read that shows a newer
// version than the cache's is observed as a renewal.
func (r *Reconciler) sessions(ctx context.Context, ns string, grants []lockingv1alpha1.LockGrant, now time.Time) (map[string]*fencing.Session, error) {
	var out map[string]*fencing.Session
	for i := range grants {
		g := &grants[i]
		ref := g.Spec.Session
		if ref == nil || g.Status.Phase.Final() {
			continue
		}
		if _, seen := out[ref.Name]; seen {
			continue
		}
		if out == nil {
			out = map[string]*fencing.Session{}
		}
		key := types.NamespacedName{Namespace: ns, Name: ref.Name}
		l := &coordinationv1.Lease{}
		err := r.Client.Get(ctx, key, l)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading session lease %s: %w", key, err)
		}
		if err == nil && isSession(l) {
			s := r.sessionsSeen.sessionFacts(l, now)
			if fencing.CheckSession(s, ref.UID, g.Spec.Owner, now) == nil && fencing.CheckSessionRenewing(s, now) == nil {
				out[ref.Name] = s
				continue
			}
		}
		// Gone, lapsed or overdue as cached: confirm with a direct read.
		l = &coordinationv1.Lease{}
		switch err := r.APIReader.Get(ctx, key, l); {
		case apierrors.IsNotFound(err):
			out[ref.Name] = nil
		case err != nil:
			return nil, fmt.Errorf("reading session lease %s: %w", key, err)
		case !isSession(l):
			out[ref.Name] = nil // no longer a session
		default:
			out[ref.Name] = r.sessionsSeen.sessionFacts(l, now)
		}
	}
	return out, nil
}

// sessionEvents records every change of a session Lease as an observation
// and, when a session ends (deleted, replaced, handed to another holder),
// reconciles the resources of the grants that name it. Renewals enqueue
// nothing: each decision already requeues at its sessions' lapse instants.
func (r *Reconciler) sessionEvents() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if l, ok := e.Object.(*coordinationv1.Lease); ok && isSession(l) {
				r.sessionsSeen.observe(l, r.Clock.Now())
				r.enqueueSessionGrants(ctx, l, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			l, ok := e.ObjectNew.(*coordinationv1.Lease)
			if !ok {
				return
			}
			if !isSession(l) {
				r.sessionsSeen.forget(l.UID)
				r.enqueueSessionGrants(ctx, l, q)
				return
			}
			r.sessionsSeen.observe(l, r.Clock.Now())
			if old, ok := e.ObjectOld.(*coordinationv1.Lease); ok && holderOf(old) != holderOf(l) {
				r.enqueueSessionGrants(ctx, l, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.sessionsSeen.forget(e.Object.GetUID())
			r.enqueueSessionGrants(ctx, e.Object, q)
		},
	}
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// enqueueSessionGrants reconciles the resources of the live grants that
// name session Lease l.
func (r *Reconciler) enqueueSessionGrants(ctx context.Context, l client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	var list lockingv1alpha1.LockGrantList
	if err := r.Client.List(ctx, &list, client.InNamespace(l.GetNamespace()), client.MatchingFields{SessionField: l.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "Listing grants of a session", "session", client.ObjectKeyFromObject(l))
		return
	}
	for i := range list.Items {
		if !list.Items[i].Status.Phase.Final() {
			for _, req := range resourceOf(ctx, &list.Items[i]) {
				q.Add(req)
			}
		}
	}
}
