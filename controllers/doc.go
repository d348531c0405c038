// Package controllers wires lockwarden's reconcilers into a manager:
// lockgrant (queues, fences, leases, records), podgate (lock-gated Pods),
// issuer (signing keys and trust bundle) and guardpolicy (the policies'
// admission webhooks). The manager binary and the test suites call Setup,
// so both run the same controllers.
package controllers

import (
	"context"
	"fmt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/lockwarden/lockwarden/controllers/guardpolicy"
	"github.com/lockwarden/lockwarden/controllers/issuer"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/controllers/podgate"
	issuerkeys "github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/membership"
	"github.com/lockwarden/lockwarden/internal/recovery"
	"github.com/lockwarden/lockwarden/internal/replicacache"
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
	// RequestIDWindow: see lockgrant.Reconciler.
	RequestIDWindow time.Duration
	// WebhookConfiguration is the ValidatingWebhookConfiguration of the
	// static guarded-write webhook, which policy webhooks copy.
	WebhookConfiguration string
	// GrantsOnEveryReplica runs the LockGrant controller on every replica,
	// outside leader election, so that grants and expiries do not wait for
	// a failover (docs/ha.md). The issuer and GuardPolicy controllers stay
	// with the leader.
	GrantsOnEveryReplica bool
	// Floors finds the fences guarded objects recorded, which the
	// LockGrant controller never issues at or below (internal/recovery);
	// nil: Setup creates one that scans at start and then every
	// FloorScanInterval.
	Floors *recovery.Scanner
	// FloorScanInterval is the time between scans of a Scanner Setup
	// creates, after the first at start; 0 scans once.
	FloorScanInterval time.Duration
	// Replica, with GrantsOnEveryReplica and a positive TakeoverDelay,
	// leaves each resource to its preferred replica for the delay
	// (lockgrant.Ownership): the other replicas act only if it does not.
	Replica ReplicaOptions
}

// ReplicaOptions configure the replicas' Leases and the takeover delay.
type ReplicaOptions struct {
	// ID is this replica's identity; its Lease is lockwarden-replica-ID in
	// the manager's namespace.
	ID string
	// TakeoverDelay is how long a replica leaves a resource to its
	// preferred replica; 0 makes every replica act on every event.
	TakeoverDelay time.Duration
	// LeaseDuration and LeaseRenew: the replica's Lease lasts LeaseDuration
	// and is renewed every LeaseRenew.
	LeaseDuration, LeaseRenew time.Duration
}

// The fence floor scan (internal/recovery) lists every kind's metadata
// (never an object's body: the lists ask for PartialObjectMetadata) to find
// the fences guarded objects recorded. Any kind may carry the guard label,
// and a GuardPolicy may name any kind, so no narrower rule is honest; the
// manager already reads any object (get) to judge guarded subresources.
// +kubebuilder:rbac:groups=*,resources=*,verbs=list

// Setup registers every controller with mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) error {
	ownership, err := setupOwnership(ctx, mgr, o)
	if err != nil {
		return err
	}
	floors := o.Floors
	if floors == nil {
		if floors, err = recovery.New(mgr.GetConfig(), mgr.GetAPIReader(), o.FloorScanInterval, mgr.GetLogger().WithName("fence-floors")); err != nil {
			return err
		}
	}
	if floors.Bundle == nil {
		// Records on objects not guarded now count only when their
		// proofs verify against the issuer's trust bundle.
		floors.Bundle = o.Keyring.TrustBundle
	}
	if floors.Unguarded == nil {
		// The namespaces the guarded-write webhooks skip
		// (config/webhook/manifests.yaml).
		floors.Unguarded = []string{metav1.NamespaceSystem, o.Namespace}
	}
	// The scan runs where the LockGrant controller does, off the grant
	// path: a normal start grants at once.
	floors.Leader = !o.GrantsOnEveryReplica
	if err := mgr.Add(floors); err != nil {
		return fmt.Errorf("adding the fence floor scan: %w", err)
	}
	if err := (&lockgrant.Reconciler{
		Floors:                 floors,
		Ownership:              ownership,
		Client:                 mgr.GetClient(),
		APIReader:              mgr.GetAPIReader(),
		Clock:                  o.Clock,
		Recorder:               mgr.GetEventRecorder("lockwarden"),
		Keyring:                o.Keyring,
		FreshKeyring:           &issuerkeys.Keyring{Reader: mgr.GetAPIReader(), Namespace: o.Keyring.Namespace},
		FinishedGrantRetention: o.FinishedGrantRetention,
		RequestIDWindow:        o.RequestIDWindow,
		NeedLeaderElection:     needLeader(o.GrantsOnEveryReplica),
	}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the LockGrant controller: %w", err)
	}
	if err := (&podgate.Reconciler{
		Client:             mgr.GetClient(),
		APIReader:          mgr.GetAPIReader(),
		Clock:              o.Clock,
		Recorder:           mgr.GetEventRecorder("lockwarden-podgate"),
		NeedLeaderElection: needLeader(o.GrantsOnEveryReplica),
	}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the gated Pod controller: %w", err)
	}
	if err := (&issuer.Reconciler{Client: mgr.GetClient(), Namespace: o.Namespace}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the FenceIssuer controller: %w", err)
	}
	if err := (&guardpolicy.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), TemplateConfig: o.WebhookConfiguration}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the GuardPolicy controller: %w", err)
	}
	return nil
}

// setupOwnership starts this replica's Lease and a cache of the replicas'
// Leases, and returns the Ownership that reads it; nil when every replica
// acts on every event.
func setupOwnership(ctx context.Context, mgr ctrl.Manager, o Options) (*lockgrant.Ownership, error) {
	ro := o.Replica
	if !o.GrantsOnEveryReplica || ro.TakeoverDelay <= 0 {
		return nil, nil
	}
	if ro.ID == "" || ro.LeaseDuration <= 0 || ro.LeaseRenew <= 0 || ro.LeaseRenew >= ro.LeaseDuration {
		return nil, fmt.Errorf("replica ownership needs an ID and a Lease renewed more often than it lasts (ID %q, duration %s, renew %s)", ro.ID, ro.LeaseDuration, ro.LeaseRenew)
	}
	members, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces:    map[string]cache.Config{o.Namespace: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{lockgrant.ReplicaLabel: "true"}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the replica Lease cache: %w", err)
	}
	if _, err := members.GetInformer(ctx, &coordinationv1.Lease{}); err != nil {
		return nil, fmt.Errorf("watching replica Leases: %w", err)
	}
	// Started on every replica, not only the leader: otherwise every
	// other replica would read an unstarted cache, act on every event at
	// once and race the preferred replica.
	if err := mgr.Add(replicacache.Of(members)); err != nil {
		return nil, fmt.Errorf("adding the replica Lease cache: %w", err)
	}
	lease := &lockgrant.ReplicaLease{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: o.Namespace, ID: ro.ID,
		Duration: ro.LeaseDuration, Renew: ro.LeaseRenew, Clock: clock.RealClock{},
	}
	if err := mgr.Add(lease); err != nil {
		return nil, err
	}
	// A replica that cannot renew its Lease is not ready: it leaves the
	// webhook Service, as it leaves the live replicas.
	if err := mgr.AddReadyzCheck("replica-lease", lease.Ready); err != nil {
		return nil, err
	}
	return &lockgrant.Ownership{
		ID: ro.ID, Members: members, Namespace: o.Namespace, Clock: clock.RealClock{},
		MaxLeaseDuration: ro.LeaseDuration,
		// However the state moves, a deferral ends within a Lease's
		// duration past the delay: a preferred replica that never acts
		// (or a Lease that names none) slows a resource, never stalls it.
		Takeover: &membership.Takeover{Delay: ro.TakeoverDelay, MaxWait: ro.TakeoverDelay + ro.LeaseDuration},
	}, nil
}

// needLeader is nil (the leader only) unless every replica runs it.
func needLeader(everyReplica bool) *bool {
	if everyReplica {
		return ptr.To(false)
	}
	return nil
}
