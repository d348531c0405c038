package podgate

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/internal/podgate"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// heartbeats remembers, for each node, the version of its Lease the
// controller saw last and when it first saw it, by the controller's
// clock. A node is judged alive from these observations only, as a
// client session is (fencing.CheckSession): never from the renewTime its
// kubelet wrote, whose clock may be off. A controller that starts has no
// observations and counts each node from the moment it first reads its
// Lease: it may keep a lost node's Pods a Lease duration longer, never
// drop a live node's earlier.
type heartbeats struct {
	mu   sync.Mutex
	seen map[string]seenLease
}

type seenLease struct {
	uid             types.UID
	resourceVersion string
	at              time.Time
}

// observe records that l was seen at now and returns when its current
// version was first seen.
func (h *heartbeats) observe(node string, l *coordinationv1.Lease, now time.Time) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen == nil {
		h.seen = map[string]seenLease{}
	}
	if s, ok := h.seen[node]; ok && s.uid == l.UID && s.resourceVersion == l.ResourceVersion {
		return s.at
	}
	h.seen[node] = seenLease{uid: l.UID, resourceVersion: l.ResourceVersion, at: now}
	return now
}

// heartbeat reads node's Lease directly and judges it at now: lapsed when
// the Lease is gone, names another holder, or has not changed for its
// duration plus fencing.SessionMargin.
func (r *Reconciler) heartbeat(ctx context.Context, node string, now time.Time) (podgate.Heartbeat, error) {
	l := &coordinationv1.Lease{}
	switch err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: NodeLeaseNamespace, Name: node}, l); {
	case apierrors.IsNotFound(err):
		return podgate.HeartbeatLapsed, nil
	case err != nil:
		return podgate.HeartbeatUnknown, fmt.Errorf("reading the heartbeat Lease of node %s: %w", node, err)
	}
	s := &fencing.Session{UID: string(l.UID), ObservedAt: r.heartbeats.observe(node, l, now)}
	if l.Spec.HolderIdentity != nil {
		s.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseDurationSeconds != nil {
		s.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if fencing.CheckSession(s, string(l.UID), node, now) != nil {
		return podgate.HeartbeatLapsed, nil
	}
	return podgate.HeartbeatLive, nil
}
