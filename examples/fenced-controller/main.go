// Command fenced-controller is a small kubebuilder-style operator whose
// leadership is fenced: its one controller (package counter) raises a
// counter in a guarded ConfigMap, and only the replica holding the current
// term's fencing token can write it. A replica that stalls past its lease
// and wakes up has its writes refused by lockwarden's admission webhook.
//
//	fenced-controller --namespace demo --identity "$(hostname)"
//
// Compared with the usual kubebuilder main.go, three things change:
//
//  1. the manager runs with LeaderElection false (every replica runs the
//     cache, the webhooks and the metrics);
//  2. the controllers are set up inside election.AddToManager's SetupFunc,
//     which runs once per term;
//  3. the reconciler's client is the term's stamping client,
//     t.Client(mgr.GetClient()), instead of mgr.GetClient().
//
// The reconciler itself is unchanged. Its identity (the kubeconfig's user)
// needs RBAC to create, watch, renew and release LockGrants and to read
// FenceCounters in --namespace, and to write the ConfigMap.
package main

import (
	"flag"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/examples/fenced-controller/counter"
	"github.com/lockwarden/lockwarden/pkg/lock/election"
)

// options are the operator's flags.
type options struct {
	namespace, identity, resource, configMap string
	lease, interval                          time.Duration
	// callbacks are the election's hooks beside the controllers.
	callbacks election.Callbacks
}

func main() {
	var o options
	var probeAddr string
	host, _ := os.Hostname()
	flag.StringVar(&o.namespace, "namespace", "default", "Namespace of the election's grants and of the counter ConfigMap.")
	flag.StringVar(&o.identity, "identity", host, "This replica's name, as the other replicas report the leader.")
	flag.StringVar(&o.resource, "resource", "controllers/fenced-controller", "The election's lock resource, guarding the ConfigMap.")
	flag.StringVar(&o.configMap, "configmap", "counter", "Name of the counter ConfigMap.")
	flag.DurationVar(&o.lease, "lease-duration", 15*time.Second, "Each term's lease, whole seconds.")
	flag.DurationVar(&o.interval, "interval", time.Second, "Time between two raises of the counter.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz; 0 disables them.")
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zo)))
	log := ctrl.Log.WithName("setup")
	o.callbacks.OnNewLeader = func(id string) { ctrl.Log.WithName("election").Info("New leader", "leader", id) }

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	cfg := ctrl.GetConfigOrDie()

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		HealthProbeBindAddress: probeAddr,
		// Change 1: no Lease-based leader election; the elector is it.
		LeaderElection: false,
	})
	if err != nil {
		log.Error(err, "Creating the manager failed")
		os.Exit(1)
	}
	// The elector reads and writes its grants directly, never from the cache.
	direct, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		log.Error(err, "Creating the client failed")
		os.Exit(1)
	}
	elector, err := setup(mgr, direct, o)
	if err != nil {
		log.Error(err, "Setting up the controllers failed")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("leader-election", elector.Check); err != nil {
		log.Error(err, "Adding the health check failed")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "The manager stopped")
		os.Exit(1)
	}
}

// setup adds the fenced election and, for each term, the counter
// controller to mgr.
func setup(mgr manager.Manager, direct client.WithWatch, o options) (*election.Elector, error) {
	// Change 2: the controllers are set up per term, under the term's
	// leader context. Before:
	//	(&counter.Reconciler{Client: mgr.GetClient(), ...}).SetupWithManager(mgr)
	return election.AddToManager(mgr, election.Config{
		Client: direct, Namespace: o.namespace, Resource: o.resource, Identity: o.identity,
		LeaseDuration: o.lease, Callbacks: o.callbacks,
	}, func(mgr manager.Manager, t *election.Term) error {
		return (&counter.Reconciler{
			// Change 3: the term's stamping client.
			Client:   t.Client(mgr.GetClient()),
			Object:   types.NamespacedName{Namespace: o.namespace, Name: o.configMap},
			Resource: o.resource,
			Writer:   o.identity,
			Interval: o.interval,
		}).SetupWithManager(mgr)
	})
}
