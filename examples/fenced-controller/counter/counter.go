// Package counter is the reconciler of the fenced-controller example: an
// ordinary controller-runtime reconciler that keeps a counter in a guarded
// ConfigMap. Nothing in it knows about leader election or fences; the
// client it is given (election.Term.Client in main.go) stamps its writes.
package counter

import (
	"context"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Data keys of the counter ConfigMap.
const (
	// CountKey holds the counter, in decimal.
	CountKey = "count"
	// WriterKey holds the Writer of the last write.
	WriterKey = "writer"
)

// Reconciler raises the counter in the ConfigMap Object by one every
// Interval, and records which Writer did it. The ConfigMap is guarded by
// Resource: labeled locking.lockwarden.io/guarded=true and annotated with
// the resource, so the guarded-write webhook checks every write's fence.
type Reconciler struct {
	// Client reads and writes the ConfigMap; in main.go, the term's
	// stamping client.
	Client client.Client
	// Object is the counter ConfigMap.
	Object types.NamespacedName
	// Resource is the lock resource guarding it.
	Resource string
	// Writer names this replica in the ConfigMap.
	Writer string
	// Interval is the time between two raises. Default 1 s.
	Interval time.Duration
}

// Reconcile raises the counter once and comes back after Interval.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.NamespacedName != r.Object {
		return ctrl.Result{}, nil
	}
	interval := r.Interval
	if interval == 0 {
		interval = time.Second
	}
	cm := &corev1.ConfigMap{}
	err := r.Client.Get(ctx, r.Object, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.Object.Namespace, Name: r.Object.Name,
				Labels:      map[string]string{lockingv1alpha1.GuardedLabel: "true"},
				Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: r.Resource}},
			Data: map[string]string{CountKey: "1", WriterKey: r.Writer},
		}
		if err := r.Client.Create(ctx, cm); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: interval}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	n, _ := strconv.ParseInt(cm.Data[CountKey], 10, 64)
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CountKey] = strconv.FormatInt(n+1, 10)
	cm.Data[WriterKey] = r.Writer
	if err := r.Client.Update(ctx, cm); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: interval}, nil
}

// SetupWithManager registers the controller: it reconciles the counter
// ConfigMap when the controller starts and when the ConfigMap is created
// or deleted, and then on its own schedule (its own updates do not trigger
// it).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	isCounter := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Object.Namespace && o.GetName() == r.Object.Name
	})
	noUpdates := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	return ctrl.NewControllerManagedBy(mgr).
		Named("counter").
		For(&corev1.ConfigMap{}, builder.WithPredicates(isCounter, noUpdates)).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(reconcile.Request{NamespacedName: r.Object})
			return nil
		})).
		Complete(r)
}
