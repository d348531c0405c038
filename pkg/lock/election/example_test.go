package election_test

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock/election"
)

// Lead, and write a guarded ConfigMap under the term's fence until the
// term ends.
func ExampleNew() {
	var c client.WithWatch // a direct client whose scheme has lockwarden's types
	e, err := election.New(election.Config{
		Client: c, Namespace: "ops", Resource: "controllers/report-writer", Identity: os.Getenv("POD_NAME"),
		LeaseDuration: 15 * time.Second,
		Callbacks: election.Callbacks{
			OnStartedLeading: func(ctx context.Context, t *election.Term) {
				w := t.Client(c)
				cm := &corev1.ConfigMap{}
				cm.Namespace, cm.Name = "ops", "report"
				cm.Labels = map[string]string{lockingv1alpha1.GuardedLabel: "true"}
				cm.Data = map[string]string{"fence": fmt.Sprint(t.Fence())}
				_ = w.Create(ctx, cm) // carries the term's claim; refused once a later term wrote
				<-ctx.Done()
			},
			OnNewLeader: func(identity string) { fmt.Println("leader:", identity) },
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = e.Run(context.Background())
}

// The controllers of a kubebuilder operator, under fenced leadership: the
// manager runs without its own leader election, and each term builds the
// controllers with the term's stamping client.
func ExampleAddToManager() {
	cfg := ctrl.GetConfigOrDie()
	mgr, _ := ctrl.NewManager(cfg, ctrl.Options{LeaderElection: false})
	direct, _ := client.NewWithWatch(cfg, client.Options{Scheme: mgr.GetScheme()})
	e, err := election.AddToManager(mgr, election.Config{
		Client: direct, Namespace: "ops", Resource: "controllers/my-operator", Identity: os.Getenv("POD_NAME"),
	}, func(mgr manager.Manager, t *election.Term) error {
		w := t.Client(mgr.GetClient())
		return ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).
			Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
				cm := &corev1.ConfigMap{}
				if err := w.Get(ctx, req.NamespacedName, cm); err != nil {
					return reconcile.Result{}, client.IgnoreNotFound(err)
				}
				return reconcile.Result{}, w.Update(ctx, cm) // fenced if cm is guarded
			}))
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = mgr.AddHealthzCheck("leader-election", e.Check)
	_ = mgr.Start(ctrl.SetupSignalHandler())
}
