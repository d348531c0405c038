package grantplan

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The grants a plan must not rest on a cached copy of. A pass lists the
// grants from a cache that may be behind the counters it reads (a replica
// that just started, or thawed after a freeze, reads its counters fresh
// while its grants' informer still catches up). Two decisions would then
// rest on a copy older than the counter: granting a request that has
// ended since (NewHolders), and ending a grant that its copy shows Held
// while no counter names it (EndsUnnamed). The controller and the fault
// simulation read those grants directly before the plan is written, by
// the same rule.

// NewHolders lists the grants p's counter writes name as a new holder:
// those the pass grants. The controller reads each directly before the
// swap names it; a cached copy that differs is replaced by the fresh one
// and the pass decided again.
func NewHolders(f Facts, p Plan) []types.UID {
	var uids []types.UID
	for _, w := range CounterWrites(f, p) {
		cur := counterOfSlot(f, w.Slot)
		if h := w.Spec.Holder; h != nil && (cur == nil || cur.Spec.Holder == nil || cur.Spec.Holder.UID != h.UID) {
			uids = append(uids, types.UID(h.UID))
		}
	}
	return uids
}

// EndsUnnamed lists the grants p ends that f shows Held while the counter
// of the slot they hold does not name them ("unnamed"): the counter moved
// on, and the pass ends them with the reason their copy suggests
// (released, expired, superseded). That copy must be as fresh as the
// counter: a copy from before the owner's release, or from before the
// swap that made the grant the holder and then handed the resource on,
// would end a grant its owner released (or one still live) as Expired.
// The controller reads each directly first; when the copy it decided on
// is not the stored one, the pass writes nothing for it (Without) and is
// decided again once the cache has caught up.
func EndsUnnamed(f Facts, p Plan) []types.UID {
	var uids []types.UID
	for _, g := range p.Statuses {
		if !g.Status.Phase.Final() {
			continue
		}
		i := slices.IndexFunc(f.Grants, func(l lockingv1alpha1.LockGrant) bool { return l.UID == g.UID })
		if i < 0 || f.Grants[i].Status.Phase != lockingv1alpha1.PhaseHeld {
			continue
		}
		listed := &f.Grants[i]
		if c := counterOfSlot(f, listed.HeldSlot()); c != nil && c.Spec.Holder != nil && c.Spec.Holder.UID == string(listed.UID) {
			continue // named: its end is judged on the counter's lease
		}
		uids = append(uids, g.UID)
	}
	return uids
}

// Without returns p without the statuses and Events of the grants uids:
// the pass writes nothing for them. Its counter writes, grants and
// deletions are unchanged; a grant EndsUnnamed lists holds no slot in any
// of them.
func Without(p Plan, uids []types.UID) Plan {
	if len(uids) == 0 {
		return p
	}
	p.Statuses = slices.DeleteFunc(slices.Clone(p.Statuses), func(g *lockingv1alpha1.LockGrant) bool { return slices.Contains(uids, g.UID) })
	p.Events = slices.DeleteFunc(slices.Clone(p.Events), func(e Event) bool { return slices.Contains(uids, e.Grant.UID) })
	return p
}

// counterOfSlot is f's counter of slot k, nil when it was not read or
// does not exist.
func counterOfSlot(f Facts, k int32) *lockingv1alpha1.FenceCounter {
	if k == 0 {
		return f.Counter
	}
	return f.SlotCounters[k]
}

// CacheCovers reports whether a grants cache that has delivered every
// LockGrant change up to resourceVersion seen shows every grant as stored
// when the counters f was decided on were written: f.Counter exists and
// it and every slot counter in f are at or below seen. A Held status is
// written only after the swap that named its grant, so a grant Held as
// stored that these counters no longer name got its Held status before
// their versions, and such a cache shows it Held, unless a status writer
// still had that Held in flight when its replica swapped the counter
// away (MayHideLateHeld says when a plan may rest on such a grant). With
// neither, NewlyHeld's confirming list of the resource's grants is not
// needed.
//
// Resource versions are compared as the etcd revisions they are
// (resourceversion.CompareResourceVersion): LockGrants and FenceCounters
// of one cluster are stored in the same etcd, whose revision orders every
// write. A version that is not well formed, a missing Counter (the
// resource's first grant) or seen "" give false: the pass lists directly.
func CacheCovers(f Facts, seen string) bool {
	if f.Counter == nil {
		return false
	}
	counters := append([]*lockingv1alpha1.FenceCounter{f.Counter}, slices.Collect(maps.Values(f.SlotCounters))...)
	for _, c := range counters {
		if c == nil {
			continue
		}
		if cmp, err := resourceversion.CompareResourceVersion(c.ResourceVersion, seen); err != nil || cmp > 0 {
			return false
		}
	}
	return true
}

// MayHideLateHeld reports whether p, whose new holders' Held statuses
// (NewlyHeld) CacheCovers would let go without a direct list of the
// resource's grants, rests on a grant the cache shows as a request that
// may in fact be Held as stored: one the cache shows neither Held nor
// final that p ends (as a request withdrawn, timed out, revoked or with
// its session gone), or that comes before a new holder in FIFO order and
// yet was not granted.
//
// CacheCovers shows every status stored before the counters f was decided
// on. A Held status can also be stored after them: a replica's status
// writer had sent it when that replica's next pass swapped the counter
// away from the grant (its owner, which learns from the counter, released
// at once), and the replica stopped before it wrote the grant's end. The
// cache then shows that grant as the request it was before its Held. A
// request that p ends gets its end after the new holders' Held, in the
// order of the statuses (only ended holders go first), and one skipped
// over in FIFO order was granted by someone: with either, the pass lists
// the resource's grants directly, which shows such a Held.
func MayHideLateHeld(f Facts, p Plan) bool {
	newly := NewlyHeld(f, p)
	if len(newly) == 0 {
		return false
	}
	ends := map[types.UID]bool{}
	for _, g := range p.Statuses {
		if g.Status.Phase.Final() {
			ends[g.UID] = true
		}
	}
	var holders []lockingv1alpha1.LockGrant
	for _, g := range f.Grants {
		if slices.Contains(newly, g.UID) {
			holders = append(holders, g)
		}
	}
	for _, g := range f.Grants {
		if slices.Contains(newly, g.UID) || g.Status.Phase == lockingv1alpha1.PhaseHeld || g.Status.Phase.Final() {
			continue
		}
		if ends[g.UID] {
			return true
		}
		for _, h := range holders {
			if fifo(g, h) < 0 {
				return true
			}
		}
	}
	return false
}
