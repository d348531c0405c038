package observe

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Buckets from 5 ms to about 20 minutes: grants are handed over in
// milliseconds when the holder releases, and after a full lease (seconds to
// minutes) when it stalls.
var grantBuckets = prometheus.ExponentialBuckets(0.005, 2.5, 14)

var (
	grantWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockwarden_grant_wait_seconds",
		Help:    "Seconds from a LockGrant's creation until it was granted.",
		Buckets: grantBuckets,
	})
	grantHandoff = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockwarden_grant_handoff_seconds",
		Help:    "Seconds a resource stood unheld between one holder's end and the grant to the next waiter.",
		Buckets: grantBuckets,
	})
)

func init() { metrics.Registry.MustRegister(grantWait, grantHandoff) }

// forgetEnded is how long the end of a grant is remembered to measure the
// handoff to a waiter: longer than any handoff worth measuring, short
// enough that the memory used follows the resources in use.
const forgetEnded = 10 * time.Minute

// GrantObserver feeds the grant histograms from the LockGrant informer.
type GrantObserver struct {
	// Cache is the manager's cache.
	Cache cache.Cache

	mu    sync.Mutex
	ended map[string]time.Time // namespace/resource -> last holder's endedAt
}

var (
	_ manager.Runnable               = &GrantObserver{}
	_ manager.LeaderElectionRunnable = &GrantObserver{}
)

// NeedLeaderElection is true: only the leader counts.
func (o *GrantObserver) NeedLeaderElection() bool { return true }

// Start registers the event handler and returns when ctx ends.
func (o *GrantObserver) Start(ctx context.Context) error {
	o.ended = map[string]time.Time{}
	inf, err := o.Cache.GetInformer(ctx, &lockingv1alpha1.LockGrant{})
	if err != nil {
		return fmt.Errorf("watching LockGrants: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			before, ok1 := oldObj.(*lockingv1alpha1.LockGrant)
			after, ok2 := newObj.(*lockingv1alpha1.LockGrant)
			if ok1 && ok2 {
				o.observe(before, after)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching LockGrants: %w", err)
	}
	<-ctx.Done()
	return inf.RemoveEventHandler(reg)
}

func (o *GrantObserver) observe(before, after *lockingv1alpha1.LockGrant) {
	key := after.Namespace + "/" + after.Spec.Resource
	o.mu.Lock()
	defer o.mu.Unlock()
	if before.Status.EndedAt == nil && after.Status.EndedAt != nil && after.Status.GrantedAt != nil {
		o.ended[key] = after.Status.EndedAt.Time
	}
	if before.Status.GrantedAt != nil || after.Status.GrantedAt == nil {
		return
	}
	granted := after.Status.GrantedAt.Time
	grantWait.Observe(nonNegative(granted.Sub(after.CreationTimestamp.Time)))
	if end, ok := o.ended[key]; ok {
		// Only a waiter that was queued before the holder ended was
		// handed the resource.
		if after.CreationTimestamp.Time.Before(end) {
			grantHandoff.Observe(nonNegative(granted.Sub(end)))
		}
		delete(o.ended, key)
	}
	for k, t := range o.ended {
		if granted.Sub(t) > forgetEnded {
			delete(o.ended, k)
		}
	}
}

func nonNegative(d time.Duration) float64 { return max(d.Seconds(), 0) }
