package sim

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// lockDelayTolerance is how much earlier than its holder's end plus the
// delay a grant may be issued without breaking the lock-delay: the end is
// recorded when the counter write lands, one network hop after the
// decision, and two replicas' clocks differ by up to twice the skew bound.
const lockDelayTolerance = 2*MaxReplicaSkew + 100*time.Millisecond

// lastEnd is how the last holder of a resource ended.
type lastEnd struct {
	at       time.Duration
	released bool
	delay    time.Duration
}

// noteHolderEnd records how the holder a counter named before a write ended,
// when the write names another holder or none: the counter moves first, and
// ended is the phase the same pass writes for it ("" when its grant is
// gone, which counts as not released). The delay is the one the holder
// requested (its grant's spec), not the one the counter recorded, so that a
// controller that forgets it is caught.
func (w *world) noteHolderEnd(resource string, before, after *lockingv1alpha1.FenceCounterSpec, ended lockingv1alpha1.LockGrantPhase) {
	if before == nil || before.Holder == nil || (after.Holder != nil && after.Holder.UID == before.Holder.UID) {
		return
	}
	if w.ends == nil {
		w.ends = map[string]lastEnd{}
	}
	released := ended == lockingv1alpha1.PhaseReleased
	delay := before.Holder.LockDelaySeconds
	if g := w.reg.grants[types.UID(before.Holder.UID)]; g != nil {
		delay = g.Spec.LockDelaySeconds
	}
	if delay > 0 && !released {
		w.rep.Faults["lock-delay-ended-unreleased"]++
	}
	w.ends[resource] = lastEnd{at: w.s.now, released: released, delay: time.Duration(delay) * time.Second}
}

// checkLockDelay judges a grant that becomes Held against the lock-delay of
// the resource's last holder. A restore rolls the counter, and the delay it
// carries, back: rounds with a restore are not judged.
func (w *world) checkLockDelay(g *lockingv1alpha1.LockGrant) {
	if g.Spec.LockDelaySeconds > 0 {
		w.rep.Faults[string(FaultLockDelay)]++
	}
	e, ok := w.ends[g.Spec.Resource]
	if !ok || e.released || e.delay == 0 || w.restoredAt > 0 {
		return
	}
	if early := e.at + e.delay - w.s.now; early > lockDelayTolerance {
		w.rep.LockDelayBroken++
		w.rep.violate("seed %d: %s granted %s before the lock-delay of the last holder had passed", w.seed, g.UID, early)
	}
}

// forgetLockDelay drops the lock-delay from a counter being stored, when a
// test breaks the controller that way.
func (r *registry) forgetLockDelay(c *lockingv1alpha1.FenceCounter) {
	if !r.dropLockDelay {
		return
	}
	c.Spec.LockDelayUntil = ""
	if c.Spec.Holder != nil {
		c.Spec.Holder.LockDelaySeconds = 0
	}
}
