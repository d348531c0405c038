// Package facts turns the registry's Kubernetes objects into the fencing
// package's facts. It is the only place that maps API phases to fencing
// states.
package facts

import (
	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Grant returns the fencing facts of a LockGrant; nil for nil.
func Grant(g *lockingv1alpha1.LockGrant) *fencing.Grant {
	if g == nil {
		return nil
	}
	f := &fencing.Grant{
		UID:      string(g.UID),
		Resource: g.Spec.Resource,
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
