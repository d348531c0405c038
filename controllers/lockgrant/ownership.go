package lockgrant

import (
	"context"
	"hash/fnv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/membership"
)

// ReplicaLabel marks the manager replicas' own Leases (lockwarden-replica-ID,
// in the manager's namespace), from which each replica learns which others
// are alive.
const ReplicaLabel = "locking.lockwarden.io/manager-replica"

// ReplicaLeasePrefix starts the name of every replica's Lease.
const ReplicaLeasePrefix = "lockwarden-replica-"

// Ownership lets a replica leave a resource to its preferred replica for a
// takeover delay, so that of several replicas running the controller
// (--grants-on-every-replica) one does the work of each event, and the
// others only check, from their caches, that it was done (docs/ha.md).
//
// It is an optimisation of work only: whether a replica acts at once or
// after the delay, its pass is the same gather, decide and compare-and-swap,
// so safety never depends on it. A nil *Ownership acts on every event at
// once.
type Ownership struct {
	// ID is this replica's identity, the holderIdentity of its Lease.
	ID string
	// Members lists the replicas' Leases (labeled ReplicaLabel) in
	// Namespace, from a cache.
	Members   client.Reader
	Namespace string
	// Clock is the real clock the Leases and the delay are judged by (the
	// controller's Clock may be a test's fake clock).
	Clock clock.PassiveClock
	// Takeover holds the delay and the deferrals in progress.
	Takeover *membership.Takeover
}

// Wait returns how long this replica leaves req's resource to its preferred
// replica before acting on it itself; 0 means act now. state reads the
// resource's grants and counter from the controller's cache. Any failure to
// read acts at once: acting is always safe, waiting only saves work.
func (o *Ownership) Wait(ctx context.Context, cache client.Reader, req reconcile.Request) time.Duration {
	if o == nil || o.Takeover == nil || o.Takeover.Delay <= 0 {
		return 0
	}
	now := o.Clock.Now()
	live, err := o.live(ctx, now)
	if err != nil {
		logf.FromContext(ctx).V(1).Info("Cannot read the replicas' Leases; acting at once", "error", err.Error())
		return 0
	}
	key := req.String()
	preferred := membership.Preferred(key, live) == o.ID
	var state uint64
	if !preferred {
		if state, err = resourceState(ctx, cache, req); err != nil {
			logf.FromContext(ctx).V(1).Info("Cannot read the resource from the cache; acting at once", "error", err.Error())
			return 0
		}
	}
	d := o.Takeover.Wait(key, preferred, state, now)
	if d > 0 {
		deferrals.Inc()
	} else if !preferred {
		takeovers.Inc()
	}
	return d
}

// live returns the replicas whose Lease has not lapsed, this one included.
func (o *Ownership) live(ctx context.Context, now time.Time) ([]string, error) {
	var leases coordinationv1.LeaseList
	if err := o.Members.List(ctx, &leases, client.InNamespace(o.Namespace), client.HasLabels{ReplicaLabel}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	members := make([]membership.Member, 0, len(leases.Items))
	for i := range leases.Items {
		members = append(members, memberOf(&leases.Items[i]))
	}
	return membership.Live(members, o.ID, now), nil
}

// memberOf reads a replica's Lease; a Lease without a renew time or a
// duration has lapsed.
func memberOf(l *coordinationv1.Lease) membership.Member {
	m := membership.Member{}
	if l.Spec.HolderIdentity != nil {
		m.ID = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime != nil {
		m.RenewTime = l.Spec.RenewTime.Time
	}
	if l.Spec.LeaseDurationSeconds != nil {
		m.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return m
}

// resourceState fingerprints what the cache shows of a resource: the
// counter's resourceVersion and each grant's UID and resourceVersion. The
// preferred replica's writes, and a client's, change it. The cache lists in
// no particular order, so the grants' hashes are summed.
func resourceState(ctx context.Context, cache client.Reader, req reconcile.Request) (uint64, error) {
	var sum uint64
	counter := &lockingv1alpha1.FenceCounter{}
	switch err := cache.Get(ctx, req.NamespacedName, counter); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return 0, err
	default:
		sum = hashOf("counter", counter.ResourceVersion)
	}
	var list lockingv1alpha1.LockGrantList
	if err := cache.List(ctx, &list, client.InNamespace(req.Namespace), client.MatchingFields{CounterNameField: req.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, err
	}
	for i := range list.Items {
		sum += hashOf(string(list.Items[i].UID), list.Items[i].ResourceVersion)
	}
	return sum, nil
}

func hashOf(a, b string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(a))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(b))
	return h.Sum64()
}

// deferrals and takeovers count what Ownership decided.
var (
	deferrals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_ownership_deferrals_total",
		Help: "Reconciles a replica left to the resource's preferred replica for a takeover delay.",
	})
	takeovers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_ownership_takeovers_total",
		Help: "Passes a replica made on a resource it is not preferred for, after the takeover delay.",
	})
)

func init() { metrics.Registry.MustRegister(deferrals, takeovers) }
