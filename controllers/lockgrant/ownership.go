package lockgrant

import (
	"context"
	"sync"
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
	"github.com/lockwarden/lockwarden/internal/clockskew"
	"github.com/lockwarden/lockwarden/internal/grantplan"
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
	// MaxLeaseDuration is the longest a replica Lease is trusted to last
	// past its renew time, and a renew time is never trusted to lie in the
	// future: every replica runs with the same Lease duration, so a longer
	// one (or a renew time ahead of our clock by more than that) is not a
	// replica's, and must not keep a resource waiting for it. 0: trust
	// the Leases as written. A renew time ahead of our clock counts as
	// now, and is reported (lockwarden_replica_lease_ahead_seconds, and
	// the log): the peer's clock is at least that far ahead of ours.
	MaxLeaseDuration time.Duration

	mu sync.Mutex
	// aheadLogged is when a peer's Lease renewed ahead of our clock was
	// last logged, by peer.
	aheadLogged map[string]time.Time
}

// Wait returns how long this replica leaves req's resource to its preferred
// replica before acting on it itself (0: act now), and whether this replica
// is the preferred one. cache reads the resource's grants and counter from
// the controller's cache. Any failure to read acts at once, as preferred:
// acting is always safe, waiting only saves work.
func (o *Ownership) Wait(ctx context.Context, cache client.Reader, req reconcile.Request) (wait time.Duration, preferred bool) {
	if o == nil || o.Takeover == nil || o.Takeover.Delay <= 0 {
		return 0, true
	}
	now := o.Clock.Now()
	live, err := o.live(ctx, now)
	if err != nil {
		logf.FromContext(ctx).V(1).Info("Cannot read the replicas' Leases; acting at once", "error", err.Error())
		return 0, true
	}
	key := req.String()
	preferred = membership.Preferred(key, live) == o.ID
	var state uint64
	if !preferred {
		if state, err = resourceState(ctx, cache, req); err != nil {
			logf.FromContext(ctx).V(1).Info("Cannot read the resource from the cache; acting at once", "error", err.Error())
			return 0, true
		}
	}
	return o.Takeover.Wait(key, preferred, state, now), preferred
}

// leaveToPreferred is Reconcile's ownership step. On the preferred replica
// it returns left=false: the pass goes on. On another replica it defers
// for the takeover delay; once the delay is over it decides on the cache
// alone (no read from the API server): if nothing is left to do, the
// preferred replica did it, and the pass ends there, requeued for the
// plan's next deadline (an expiry, a wait limit) so that this replica
// checks again then. Otherwise the pass goes on as a takeover, with the
// direct reads and the compare-and-swap of any pass.
func (r *Reconciler) leaveToPreferred(ctx context.Context, req reconcile.Request) (res reconcile.Result, left bool) {
	wait, preferred := r.Ownership.Wait(ctx, r.Client, req)
	switch {
	case wait > 0:
		deferrals.Inc()
		return reconcile.Result{RequeueAfter: wait}, true
	case preferred:
		return reconcile.Result{}, false
	}
	f, err := r.gather(ctx, req, cacheOnly)
	if err != nil || f.Resource == "" {
		return reconcile.Result{}, false
	}
	if p := grantplan.Decide(f.Facts); p.Empty() {
		checks.Inc()
		return reconcile.Result{RequeueAfter: p.RequeueAfter}, true
	}
	takeovers.Inc()
	return reconcile.Result{}, false
}

// live returns the replicas whose Lease has not lapsed, this one included.
func (o *Ownership) live(ctx context.Context, now time.Time) ([]string, error) {
	var leases coordinationv1.LeaseList
	if err := o.Members.List(ctx, &leases, client.InNamespace(o.Namespace), client.HasLabels{ReplicaLabel}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	members := make([]membership.Member, 0, len(leases.Items))
	var maxAhead time.Duration
	for i := range leases.Items {
		l := &leases.Items[i]
		m := memberOf(l)
		if l.Name != ReplicaLeasePrefix+m.ID {
			continue // not a replica's own Lease
		}
		if o.MaxLeaseDuration > 0 {
			m.Duration = min(m.Duration, o.MaxLeaseDuration)
			if ahead := m.RenewTime.Sub(now); ahead > 0 && m.ID != o.ID {
				// Renewed "in the future": the peer's clock is at least
				// this far ahead of ours (or the Lease is forged). It
				// counts as renewed now, never later, and it is
				// reported.
				maxAhead = max(maxAhead, ahead)
				o.aheadOf(ctx, m.ID, ahead, now)
				m.RenewTime = now
			}
		}
		members = append(members, m)
	}
	leaseAhead.Set(maxAhead.Seconds())
	return membership.Live(members, o.ID, now), nil
}

// aheadOf logs a peer's Lease renewed further ahead of this replica's
// clock than the clock-skew bound, at most once a minute per peer (the
// metric lockwarden_replica_lease_ahead_seconds shows any lead).
func (o *Ownership) aheadOf(ctx context.Context, peer string, ahead time.Duration, now time.Time) {
	if ahead <= clockskew.DocumentedBound {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if last, ok := o.aheadLogged[peer]; ok && now.Sub(last) < time.Minute {
		return
	}
	if o.aheadLogged == nil {
		o.aheadLogged = map[string]time.Time{}
	}
	o.aheadLogged[peer] = now
	logf.FromContext(ctx).Info("A replica Lease was renewed further ahead of this replica's clock than the clock-skew bound: one of the two clocks is off (lockwarden_clock_skew_seconds on each says which), or the Lease is forged; it counts as renewed now",
		"replica", peer, "ahead", ahead.String(), "bound", clockskew.DocumentedBound.String())
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
		sum = membership.PairHash("counter", counter.ResourceVersion)
	}
	var list lockingv1alpha1.LockGrantList
	if err := cache.List(ctx, &list, client.InNamespace(req.Namespace), client.MatchingFields{CounterNameField: req.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, err
	}
	for i := range list.Items {
		sum += membership.PairHash(string(list.Items[i].UID), list.Items[i].ResourceVersion)
	}
	return sum, nil
}

// deferrals, checks and takeovers count what a replica that is not
// preferred did.
var (
	deferrals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_ownership_deferrals_total",
		Help: "Reconciles a replica left to the resource's preferred replica for a takeover delay.",
	})
	checks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_ownership_checks_total",
		Help: "Takeover checks, on the cache, that found a resource's preferred replica had done everything.",
	})
	takeovers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockwarden_ownership_takeovers_total",
		Help: "Passes a replica made on a resource it is not preferred for, after the takeover delay, because work was left.",
	})
)

// leaseAhead is how far ahead of this replica's clock the peer Lease
// renewed furthest in the future was, at the last check.
var leaseAhead = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "lockwarden_replica_lease_ahead_seconds",
	Help: "How far ahead of this replica's clock the peer replica Lease renewed furthest in the future was, at the last ownership check (0: none): that peer's clock is at least that far ahead (or its Lease is forged). Such a Lease counts as renewed now.",
})

func init() { metrics.Registry.MustRegister(deferrals, checks, takeovers, leaseAhead) }
