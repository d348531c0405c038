package lock

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// The fast path: an exclusive grant holds exactly while its resource's
// FenceCounter names its UID, and the controller writes the counter (a
// compare-and-swap) before the grant's status. A Handle that follows the
// counter learns that it holds, and that it no longer does, one API write
// earlier than from the status. The status still arrives and must agree.

// followsCounter reports whether a request learns that it holds from its
// resource's FenceCounter as well as from its status: an exclusive request
// (permits 1) without a GuardPolicy. A grant under a policy needs its
// signed proof, which only the status carries, before it can write; a grant
// with permits holds one of several slot counters, which its status names.
func followsCounter(s *settings) bool {
	return s.permits <= 1 && s.policy == ""
}

// counterKey is the FenceCounter of the handle's resource.
func (h *Handle) counterKey() types.NamespacedName {
	return types.NamespacedName{Namespace: h.key.Namespace, Name: lockingv1alpha1.FenceCounterName(h.resource)}
}

// followCounter watches the resource's FenceCounter and sends every state
// of it (nil while it does not exist) to out, until ctx ends. When the
// watch is refused for good (the caller may not read FenceCounters) it
// stops, and the handle learns from the grant's status alone.
func (h *Handle) followCounter(ctx context.Context, out chan<- *lockingv1alpha1.FenceCounter) {
	key := h.counterKey()
	err := watchCounter(ctx, h.c.c, h.clk, key, func(fc *lockingv1alpha1.FenceCounter) (bool, error) {
		select {
		case out <- fc:
			return false, nil
		case <-ctx.Done():
			return true, nil
		}
	})
	if err != nil && ctx.Err() == nil {
		h.log.V(1).Info("Not following the resource's fence record; learning from the grant's status alone",
			"grant", h.key, "counter", key, "error", err.Error())
	}
}

// observeCounter applies one read of the resource's FenceCounter (nil when
// it does not exist); h.mu held. While the grant is not known to hold, a
// counter that names its UID makes it Held with the counter's fence. Once
// it held, a counter at or past its fence that no longer names it ends the
// acquisition with the refusal admission gives a write under this grant
// (fencing.CheckHolderOfRecord). An older counter (a watch that has not
// caught up with the grant's status yet) says nothing. A handle that is
// releasing, or whose grant already ended, ignores the counter.
func (h *Handle) observeCounter(now holder.Mono, fc *lockingv1alpha1.FenceCounter) {
	if h.m.State().Final() || h.m.Releasing() || h.last == nil || h.last.Status.Phase.Final() {
		return
	}
	c := fencing.Counter{}
	if f := facts.Counter(fc); f != nil {
		c = *f
	}
	fence := h.m.Fence()
	switch {
	case c.HolderUID == string(h.uid):
		if fence == 0 {
			h.heldByCounter(now, fc.Spec.Holder)
		}
	case fence != 0 && c.Fence >= fence:
		if err := fencing.CheckHolderOfRecord(c, h.resource, string(h.uid), fence); err != nil {
			h.log.V(1).Info("The resource's fence record moved past this grant", "grant", h.key, "reason", string(fencing.ReasonOf(err)))
			h.end(now, err)
		}
	}
}

// heldByCounter makes the grant Held with the fence the counter issued it,
// as a status that says so would; h.mu held. The deadline rules are the
// status's: counted from the create's send time, or, for a grant found by
// its request ID or granted a renew interval or more after its create was
// sent, from a confirming renew.
func (h *Handle) heldByCounter(now holder.Mono, hold *lockingv1alpha1.FenceHolder) {
	f := holder.FactsOf(h.last)
	f.Phase, f.Fence = lockingv1alpha1.PhaseHeld, hold.Fence
	h.m.Observe(now, f)
	h.log.V(1).Info("The resource's fence record names this grant: held", "grant", h.key, "fence", hold.Fence)
	h.bump()
}

// end ends the acquisition with refusal r; h.mu held. A handle that held
// closes Done with ErrLost wrapping r; one that never held makes Acquire
// fail with r's reason.
func (h *Handle) end(now holder.Mono, r error) {
	if h.heldOnce {
		h.spend(fmt.Errorf("%w: %w", ErrLost, r))
	}
	h.m.Refused(now, fencing.ReasonOf(r))
	h.bump()
}

// fenceDisagrees reports whether a read of the grant shows it Held with
// another fence than the one the handle holds with (learned from the
// counter); h.mu held. The registry issued one fence per grant, so this
// never happens unless a record was rewritten; the handle then stops.
func (h *Handle) fenceDisagrees(g *lockingv1alpha1.LockGrant) bool {
	return g.Status.Phase == lockingv1alpha1.PhaseHeld && h.m.Fence() != 0 && g.Status.FenceToken != h.m.Fence()
}
