package sim

import (
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// lockDelayTolerance is how much earlier than its holder's end plus the
// delay a grant may be issued without breaking the lock-delay: the end is
// recorded when its status write lands, one network hop after the decision,
// and two replicas' clocks differ by up to twice the skew bound.
const lockDelayTolerance = 2*MaxReplicaSkew + 100*time.Millisecond

// lastEnd is how the last holder of a resource ended.
type lastEnd struct {
	at       time.Duration
	released bool
	delay    time.Duration
}

// noteHolderEnd records the end of g if the counter names it as holder:
// its end is written before the counter moves on.
func (w *world) noteHolderEnd(g *lockingv1alpha1.LockGrant) {
	c := w.reg.counters[g.Spec.Resource]
	if c == nil || c.Spec.Holder == nil || c.Spec.Holder.UID != string(g.UID) {
		return
	}
	if w.ends == nil {
		w.ends = map[string]lastEnd{}
	}
	if g.Spec.LockDelaySeconds > 0 && g.Status.Phase != lockingv1alpha1.PhaseReleased {
		w.rep.Faults["lock-delay-ended-unreleased"]++
	}
	w.ends[g.Spec.Resource] = lastEnd{at: w.s.now, released: g.Status.Phase == lockingv1alpha1.PhaseReleased,
		delay: time.Duration(g.Spec.LockDelaySeconds) * time.Second}
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
