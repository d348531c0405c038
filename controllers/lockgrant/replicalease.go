package lockgrant

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// ReplicaLease keeps this replica's own Lease (ReplicaLeasePrefix+ID)
// renewed, so that the other replicas count it among the live ones and
// leave it the resources it is preferred for. It renews every Renew with
// a duration of Duration, deletes its Lease when the manager stops (the
// others take over at once, not after the Lease lapses), and deletes other
// replicas' Leases that lapsed long ago (replicas that were replaced).
//
// It runs on every replica, outside leader election.
type ReplicaLease struct {
	// Client writes the Lease; Reader reads Leases directly from the API
	// server (the manager's cache holds only session Leases).
	Client    client.Client
	Reader    client.Reader
	Namespace string
	ID        string
	// Duration is the Lease's duration (whole seconds, at least 1).
	Duration time.Duration
	// Renew is how often it is renewed.
	Renew time.Duration
	// Clock writes renewTime; real in production.
	Clock clock.PassiveClock

	// cur is the Lease as last written, renewed without reading it again.
	cur *coordinationv1.Lease
	// renewedAt is when the last renewal succeeded (unix nanoseconds).
	renewedAt atomic.Int64
}

var (
	_ manager.Runnable               = (*ReplicaLease)(nil)
	_ manager.LeaderElectionRunnable = (*ReplicaLease)(nil)
)

// staleLeaseAfter is how long after it lapsed another replica's Lease is
// deleted.
const staleLeaseAfter = 10 * time.Minute

// NeedLeaderElection is false: every replica announces itself.
func (*ReplicaLease) NeedLeaderElection() bool { return false }

// Start renews the Lease until ctx ends, then deletes it.
func (l *ReplicaLease) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithValues("lease", l.name())
	lastGC := time.Time{}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		// A renewal that hangs (a partition) must not outlast the Lease.
		rctx, cancel := context.WithTimeout(ctx, l.Duration/2)
		err := l.renew(rctx)
		cancel()
		if err != nil {
			log.Info("Renewing the replica Lease failed", "error", err.Error())
		} else {
			l.renewedAt.Store(l.Clock.Now().UnixNano())
		}
		if now := l.Clock.Now(); now.Sub(lastGC) > time.Minute {
			lastGC = now
			if err := l.deleteStale(ctx); err != nil {
				log.Info("Deleting lapsed replica Leases failed", "error", err.Error())
			}
		}
	}, l.Renew)
	// Leave at once: the other replicas stop deferring to this one.
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	err := l.Client.Delete(stop, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.name()}})
	if err != nil && !apierrors.IsNotFound(err) {
		log.Info("Deleting the replica Lease failed", "error", err.Error())
	}
	return nil
}

// Ready is a readiness check: it fails unless the Lease was renewed within
// its duration. A replica that cannot reach the API server (partitioned)
// thus leaves the webhook Service's endpoints, as the other replicas stop
// counting it among the live ones: its webhooks could not read a grant.
func (l *ReplicaLease) Ready(*http.Request) error {
	last := time.Unix(0, l.renewedAt.Load())
	if age := l.Clock.Now().Sub(last); age >= l.Duration {
		return fmt.Errorf("the replica Lease %s was last renewed %s ago", l.name(), age.Round(time.Millisecond))
	}
	return nil
}

func (l *ReplicaLease) name() string { return ReplicaLeasePrefix + l.ID }

// renew creates the Lease or moves its renewTime to now. It updates the
// Lease as it last wrote it, and reads it again only after a failed write.
func (l *ReplicaLease) renew(ctx context.Context) error {
	now := metav1.NewMicroTime(l.Clock.Now())
	secs := int32(max(1, l.Duration.Round(time.Second)/time.Second))
	if l.cur == nil {
		cur := &coordinationv1.Lease{}
		err := l.Reader.Get(ctx, types.NamespacedName{Namespace: l.Namespace, Name: l.name()}, cur)
		if apierrors.IsNotFound(err) {
			cur = &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.name(), Labels: map[string]string{ReplicaLabel: "true"}},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity: ptr.To(l.ID), LeaseDurationSeconds: ptr.To(secs),
					AcquireTime: &now, RenewTime: &now,
				},
			}
			if err := l.Client.Create(ctx, cur); err != nil {
				return err
			}
			l.cur = cur
			return nil
		}
		if err != nil {
			return err
		}
		l.cur = cur
	}
	next := l.cur.DeepCopy()
	next.Spec.HolderIdentity, next.Spec.LeaseDurationSeconds, next.Spec.RenewTime = ptr.To(l.ID), ptr.To(secs), &now
	if err := l.Client.Update(ctx, next); err != nil {
		l.cur = nil
		return err
	}
	l.cur = next
	return nil
}

// deleteStale deletes other replicas' Leases that lapsed staleLeaseAfter
// ago, each with a resourceVersion precondition (a replica that came back
// renewed it).
func (l *ReplicaLease) deleteStale(ctx context.Context) error {
	var leases coordinationv1.LeaseList
	if err := l.Reader.List(ctx, &leases, client.InNamespace(l.Namespace), client.HasLabels{ReplicaLabel}); err != nil {
		return err
	}
	now := l.Clock.Now()
	for i := range leases.Items {
		le := &leases.Items[i]
		m := memberOf(le)
		if m.ID == l.ID || !m.Lapsed(now.Add(-staleLeaseAfter)) {
			continue
		}
		rv := le.ResourceVersion
		if err := l.Client.Delete(ctx, le, client.Preconditions{ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting lapsed replica Lease %s: %w", le.Name, err)
		}
	}
	return nil
}

var notDNS = regexp.MustCompile(`[^a-z0-9.-]+`)

// ReplicaID turns a host or pod name into a replica identity that can end
// a Lease's name: lowercase, [a-z0-9.-] only, at most 63 characters, never
// empty.
func ReplicaID(s string) string {
	s = strings.Trim(notDNS.ReplaceAllString(strings.ToLower(s), "-"), "-.")
	if len(s) > 63-len(ReplicaLeasePrefix) {
		s = strings.Trim(s[:63-len(ReplicaLeasePrefix)], "-.")
	}
	if s == "" {
		s = "replica"
	}
	return s
}
