// Package webhook gathers lockwarden's admission webhooks. Each subpackage
// is plumbing: it reads the facts a decision needs and calls the rules in
// pkg/fencing; none of them holds a fencing rule of its own.
//
//   - lockgrant: defaults the owner to the requester, stamps the request
//     time, and lets only the owner renew or release.
//   - fencecounter: refuses to lower a fence or to delete a counter whose
//     resource still has grants.
//   - guard: the guarded-write webhook, the enforcement point for
//     Kubernetes objects labeled locking.lockwarden.io/guarded=true.
package webhook

import (
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/lockwarden/lockwarden/webhook/fencecounter"
	"github.com/lockwarden/lockwarden/webhook/guard"
	"github.com/lockwarden/lockwarden/webhook/lockgrant"
)

// Paths the webhooks are served at; config/webhook/manifests.yaml uses them.
const (
	MutateLockGrantPath      = "/mutate-locking-lockwarden-io-v1alpha1-lockgrant"
	ValidateLockGrantPath    = "/validate-locking-lockwarden-io-v1alpha1-lockgrant"
	ValidateFenceCounterPath = "/validate-locking-lockwarden-io-v1alpha1-fencecounter"
	GuardPath                = "/validate-guarded"
)

// Setup registers every webhook with the manager's webhook server. clk is
// the clock admission judges leases by; it must be the controller's clock.
func Setup(mgr ctrl.Manager, clk clock.PassiveClock) error {
	reader := mgr.GetAPIReader()
	srv := mgr.GetWebhookServer()
	srv.Register(MutateLockGrantPath, lockgrant.NewDefaulter(mgr.GetScheme(), clk))
	srv.Register(ValidateLockGrantPath, lockgrant.NewValidator(mgr.GetScheme(), clk))
	srv.Register(ValidateFenceCounterPath, fencecounter.NewValidator(mgr.GetScheme(), reader))
	srv.Register(GuardPath, guard.NewWebhook(reader, clk))
	return nil
}
