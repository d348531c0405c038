// Package controllers wires lockwarden's reconcilers into a manager:
// lockgrant (queues, fences, leases, records), issuer (signing keys and trust
// bundle) and guardpolicy (the policies' admission webhooks). The manager
// binary and the test suites call Setup, so both run the same controllers.
package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/lockwarden/lockwarden/controllers/guardpolicy"
	"github.com/lockwarden/lockwarden/controllers/issuer"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	issuerkeys "github.com/lockwarden/lockwarden/internal/issuer"
)

// Options configure the controllers.
type Options struct {
	// Clock judges every lease; the webhooks must use the same one.
	Clock clock.PassiveClock
	// Keyring reads the issuer's epoch and keys.
	Keyring *issuerkeys.Keyring
	// Namespace is the manager's namespace (keys Secret, trust bundle).
	Namespace string
	// FinishedGrantRetention: see lockgrant.Reconciler.
	FinishedGrantRetention time.Duration
	// WebhookConfiguration is the ValidatingWebhookConfiguration of the
	// static guarded-write webhook, which policy webhooks copy.
	WebhookConfiguration string
	// GrantsOnEveryReplica runs the LockGrant controller on every replica,
	// outside leader election, so that grants and expiries do not wait for
	// a failover (docs/ha.md). The issuer and GuardPolicy controllers stay
	// with the leader.
	GrantsOnEveryReplica bool
}

// Setup registers every controller with mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) error {
	if err := (&lockgrant.Reconciler{
		Client:                 mgr.GetClient(),
		APIReader:              mgr.GetAPIReader(),
		Clock:                  o.Clock,
		Recorder:               mgr.GetEventRecorder("lockwarden"),
		Keyring:                o.Keyring,
		FinishedGrantRetention: o.FinishedGrantRetention,
		NeedLeaderElection:     needLeader(o.GrantsOnEveryReplica),
	}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the LockGrant controller: %w", err)
	}
	if err := (&issuer.Reconciler{Client: mgr.GetClient(), Namespace: o.Namespace}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the FenceIssuer controller: %w", err)
	}
	if err := (&guardpolicy.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), TemplateConfig: o.WebhookConfiguration}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the GuardPolicy controller: %w", err)
	}
	return nil
}

// needLeader is nil (the leader only) unless every replica runs it.
func needLeader(everyReplica bool) *bool {
	if everyReplica {
		return ptr.To(false)
	}
	return nil
}
