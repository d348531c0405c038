package envtest

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/issuer"
)

// SkewedClock is a clock that reads Skew ahead of Base (behind, when Skew
// is negative): a second manager replica whose clock is off.
type SkewedClock struct {
	Base clock.PassiveClock
	Skew time.Duration
}

var _ clock.PassiveClock = SkewedClock{}

// Now is Base's time plus Skew.
func (c SkewedClock) Now() time.Time { return c.Base.Now().Add(c.Skew) }

// Since is the time elapsed since t by this clock.
func (c SkewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// StartReplica runs a second manager replica's LockGrant controller on clk,
// beside the suite's in-process manager, as two replicas run it with
// --grants-on-every-replica: both reconcile every resource at once. It
// serves no webhooks (the API server calls the first). The replica stops
// when ctx is done.
func (e *Env) StartReplica(ctx context.Context, clk clock.PassiveClock) error {
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme: e.Scheme,
		Cache: cache.Options{
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Secret{}:    {Namespaces: map[string]cache.Config{ManagerNamespace: {}}},
				&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{ManagerNamespace: {}}},
			},
			// No reader of the cache uses managedFields (every write
			// sends none, which keeps the stored ones): they are most of a
			// small object's bytes, decoded and kept for every version.
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		Metrics: metricsserver.Options{BindAddress: "0"},
		// The same controller name as the first replica's, in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return err
	}
	r := &lockgrant.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Clock: clk,
		Recorder:           mgr.GetEventRecorder("lockwarden-replica"),
		Keyring:            &issuer.Keyring{Reader: mgr.GetClient(), Namespace: ManagerNamespace},
		NeedLeaderElection: ptr.To(false),
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "replica stopped: %v\n", err)
		}
	}()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return fmt.Errorf("replica's cache never synced")
	}
	return nil
}
