// Package k8s maps lockwarden's Kubernetes objects (LockGrant, FenceCounter)
// to the facts the rules of package fencing judge, for every enforcement
// point: the admission webhooks, and a verifier outside the cluster that
// reads the registry through the Kubernetes API. It is the only place that
// maps API phases to fencing states, including the rule that a grant whose
// owner asked to release admits nothing more from that write on.
//
// A verifier must read the grant and the counter linearizably (a direct
// read from the API server, never an informer cache): ReadRegistry does.
package k8s

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// NamespaceTerminating reports whether namespace name is being deleted, the
// fact the rules that let records go with their namespace judge
// (fencing.CheckCounterDelete, fencing.CheckGrantDelete, the delete of a
// guarded object). An empty name (a cluster-scoped object) is no namespace:
// false.
func NamespaceTerminating(ctx context.Context, r client.Reader, name string) (bool, error) {
	if name == "" {
		return false, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: name}, ns); err != nil {
		return false, fmt.Errorf("reading namespace %s: %w", name, err)
	}
	return ns.DeletionTimestamp != nil, nil
}

// ReadRegistry reads the grant ns/name and the FenceCounter of resource (a
// fenced resource ID: a resource, or one slot "ID#k" of a resource with
// permits) in ns with r, both at once, and returns their facts; nil for one that does
// not exist. r must read from the API server (for example a client built
// with client.New, not a manager's cached client): a stale grant or counter
// could make a superseded write look current. The two reads may land in
// either order: the counter moves past a grant only after the grant's end
// was written, its owner asked to release, or it was deleted, and each of
// those is visible in the grant that is read.
func ReadRegistry(ctx context.Context, r client.Reader, ns, name, resource string) (*fencing.Grant, *fencing.Counter, error) {
	grant := &lockingv1alpha1.LockGrant{}
	counter := &lockingv1alpha1.FenceCounter{}
	var g errgroup.Group
	g.Go(func() error {
		switch err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, grant); {
		case apierrors.IsNotFound(err):
			grant = nil
		case err != nil:
			return fmt.Errorf("reading grant %s/%s: %w", ns, name, err)
		}
		return nil
	})
	g.Go(func() error {
		key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(resource)}
		switch err := r.Get(ctx, key, counter); {
		case apierrors.IsNotFound(err):
			counter = nil
		case err != nil:
			return fmt.Errorf("reading fence counter %s: %w", key, err)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return Grant(grant), Counter(counter), nil
}

// Grant returns the fencing facts of a LockGrant; nil for nil. Its resource
// is the grant's fenced resource ID (LockGrant.HeldFencedResource): for a
// grant of a resource with permits, the slot it holds, so that an object or
// row bound to another slot refuses it (BINDING_MISMATCH).
func Grant(g *lockingv1alpha1.LockGrant) *fencing.Grant {
	if g == nil {
		return nil
	}
	f := &fencing.Grant{
		UID:      string(g.UID),
		Resource: g.HeldFencedResource(),
		Owner:    g.Spec.Owner,
		State:    State(g.Status.Phase),
		Fence:    g.Status.FenceToken,
	}
	if g.Status.ExpiresAt != nil {
		f.ExpiresAt = g.Status.ExpiresAt.Time
	}
	if g.Spec.Release && (f.State == fencing.StateHeld || f.State == fencing.StatePending) {
		// The owner asked to release (or withdraw): from that write on,
		// the grant admits no more writes, renewals or releases, even
		// before the controller has answered.
		f.State = fencing.StateReleased
	}
	return f
}

// State maps a LockGrant phase to a fencing state; an unset phase (not yet
// seen by the controller) is Pending.
func State(p lockingv1alpha1.LockGrantPhase) fencing.State {
	switch p {
	case lockingv1alpha1.PhaseHeld:
		return fencing.StateHeld
	case lockingv1alpha1.PhaseExpired:
		return fencing.StateExpired
	case lockingv1alpha1.PhaseReleased:
		return fencing.StateReleased
	case lockingv1alpha1.PhaseTimedOut:
		return fencing.StateTimedOut
	case lockingv1alpha1.PhaseRevoked:
		return fencing.StateRevoked
	}
	return fencing.StatePending
}

// Counter returns the fencing facts of a FenceCounter; nil for nil.
func Counter(c *lockingv1alpha1.FenceCounter) *fencing.Counter {
	if c == nil {
		return nil
	}
	f := &fencing.Counter{Fence: c.Spec.Fence}
	if c.Spec.Holder != nil {
		f.HolderUID = c.Spec.Holder.UID
	}
	return f
}
