// Package webhook gathers lockwarden's admission webhooks and registers
// them with the manager (Setup). Each subpackage is plumbing: it reads the
// facts a decision needs and calls the rules in pkg/fencing (or
// internal/policy); none of them holds a fencing rule of its own. Every
// refusal carries a reason code of the pkg/fencing catalog: a fencing
// refusal is a 403 Forbidden whose message starts with the code and whose
// details.causes[0].type is the code; a malformed object is a 422 Invalid
// whose causes name the user's fields, each detail starting with
// INVALID_SPEC or INVALID_POLICY.
//
//   - lockgrant: refuses a field of the wrong JSON type, defaults the owner
//     to the requester, stamps the request time, refuses a request ID the
//     namespace's RequestIDLedger holds as spent (and marks one reused
//     after its window), checks the request against its session Lease and
//     GuardPolicy, accepts a grant for another identity only from the
//     manager for the gated Pod it names, lets only the owner (or that
//     grant's steward, the manager) renew or release, and requires the
//     force-release verb to delete someone else's live grant.
//   - fencecounter: refuses a counter not named after its resource, any
//     lowering of a fence (FENCE_REGRESSION), and deleting a counter while
//     its namespace exists (COUNTER_PROTECTED).
//   - fenceissuer: refuses to delete the FenceIssuer (COUNTER_PROTECTED).
//   - guardpolicy: refuses a GuardPolicy that could not be installed.
//   - gatedpod: holds back every Pod created with a lock annotation (and
//     no other) behind a scheduling gate until the manager has its grant,
//     after checking the annotations and that the Pod's ServiceAccount may
//     acquire (docs/gated-workloads.md).
//   - guard: the guarded-write webhooks, the enforcement point for
//     Kubernetes objects labeled locking.lockwarden.io/guarded=true or
//     covered by a GuardPolicy: a mutating webhook checks and consumes the
//     claim of every create and update, a validating one checks deletes,
//     one without objectSelector refuses scale, eviction and binding
//     requests on guarded objects (Shadow policies: record-only), and one
//     warns about a guard label that guards nothing.
package webhook

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/metadata"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/webhook/fencecounter"
	"github.com/lockwarden/lockwarden/webhook/fenceissuer"
	"github.com/lockwarden/lockwarden/webhook/gatedpod"
	"github.com/lockwarden/lockwarden/webhook/guard"
	"github.com/lockwarden/lockwarden/webhook/guardpolicy"
	"github.com/lockwarden/lockwarden/webhook/lockgrant"
)

// Paths the webhooks are served at; config/webhook/manifests.yaml uses them.
const (
	MutateLockGrantPath      = "/mutate-locking-lockwarden-io-v1alpha1-lockgrant"
	ValidateLockGrantPath    = "/validate-locking-lockwarden-io-v1alpha1-lockgrant"
	ValidateFenceCounterPath = "/validate-locking-lockwarden-io-v1alpha1-fencecounter"
	GuardMutatePath          = "/mutate-guarded"
	GuardDeletePath          = "/validate-guarded"
	GuardSubresourcePath     = "/validate-guarded-subresource"
	GuardLabelWarningPath    = "/warn-guard-label"
	ValidateGuardPolicyPath  = "/validate-locking-lockwarden-io-v1alpha1-guardpolicy"
	ValidateFenceIssuerPath  = "/validate-locking-lockwarden-io-v1alpha1-fenceissuer"
	MutateGatedPodPath       = "/mutate-gated-pod"
)

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=selfsubjectreviews,verbs=create

// Setup registers every webhook with the manager's webhook server. clk is
// the clock admission judges leases by; it must be the controller's clock.
// bundle returns the issuer's trust bundle; requestIDWindow is the
// manager's --request-id-window; reads its --guard-reads: with
// guard.ReadsCached the guarded-write webhooks accept from the manager's
// informer of FenceCounters where it names the claimed grant with a live
// lease, and read the API server before anything else (guard.Checker).
func Setup(mgr ctrl.Manager, clk clock.PassiveClock, bundle func(context.Context) (*fencing.TrustBundle, error), requestIDWindow time.Duration, reads guard.Reads) error {
	meta, err := metadata.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("metadata client: %w", err)
	}
	reader := mgr.GetAPIReader()
	srv := mgr.GetWebhookServer()
	// Every webhook finishes what it accepted, also while the replica shuts
	// down (finishing).
	register := func(path string, w *admission.Webhook) { srv.Register(path, finish(w)) }
	register(MutateLockGrantPath, lockgrant.NewDefaulter(mgr.GetScheme(), clk, reader))
	self, err := lockgrant.SelfIdentity(mgr.GetConfig())
	if err != nil {
		return err
	}
	register(ValidateLockGrantPath, lockgrant.NewValidator(mgr.GetScheme(), clk, mgr.GetClient(), mgr.GetClient(), reader,
		lockgrant.WithPodGrants(reader, self), lockgrant.WithRequestIDWindow(requestIDWindow, reader)))
	register(ValidateFenceCounterPath, fencecounter.NewValidator(mgr.GetScheme(), reader))
	register(ValidateGuardPolicyPath, guardpolicy.NewValidator(mgr.GetScheme()))
	register(ValidateFenceIssuerPath, fenceissuer.NewValidator(mgr.GetScheme()))

	register(MutateGatedPodPath, &admission.Webhook{Handler: &gatedpod.Handler{
		Decoder: admission.NewDecoder(mgr.GetScheme()), Authorizer: mgr.GetClient(), Clock: clk,
	}})

	if reads != guard.ReadsDirect {
		// The guarded-write webhooks read FenceCounters from the manager's
		// informer on every replica, also where no grant controller runs
		// (--grants-on-every-replica=false): start it now, not on the
		// first guarded write.
		if _, err := mgr.GetCache().GetInformer(context.Background(), &lockingv1alpha1.FenceCounter{}, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("the FenceCounter informer: %w", err)
		}
	}
	recorder := mgr.GetEventRecorder("lockwarden-guard")
	checker := &guard.Checker{Reader: reader, Cache: reads.CacheFor(mgr.GetCache()), Clock: clk, Bundle: bundle, Authorizer: mgr.GetClient(), Recorder: recorder}
	label := finish(&admission.Webhook{Handler: &guard.LabelHandler{Checker: checker, Policies: mgr.GetClient()}})
	srv.Register(GuardMutatePath, label)
	srv.Register(GuardDeletePath, label)
	register(GuardSubresourcePath, &admission.Webhook{Handler: &guard.SubresourceHandler{Metadata: meta, Policies: mgr.GetClient()}})
	register(GuardLabelWarningPath, &admission.Webhook{Handler: guard.LabelWarner{}})
	register(lockingv1alpha1.GuardPolicyEnforcePathPrefix, &admission.Webhook{
		Handler:         &guard.PolicyHandler{Checker: checker, Policies: mgr.GetClient(), Recorder: recorder},
		WithContextFunc: guard.WithPath,
	})
	register(lockingv1alpha1.GuardPolicyShadowPathPrefix, &admission.Webhook{
		Handler:         &guard.PolicyHandler{Checker: checker, Policies: mgr.GetClient(), Recorder: recorder, Shadow: true},
		WithContextFunc: guard.WithPath,
	})
	return nil
}
