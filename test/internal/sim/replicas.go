package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/membership"
)

// MaxReplicaSkew is the clock-skew bound between manager replicas that the
// simulation plays: each round's two deciders have clocks up to this far
// ahead of or behind the registry's, the bound docs/ha.md states.
const MaxReplicaSkew = 250 * time.Millisecond

// replica is one manager replica running the LockGrant controller, as the
// manager runs it with --grants-on-every-replica and a takeover delay:
// each resource has a preferred replica (rendezvous hashing over the
// replicas whose Lease is live, by this replica's clock), which acts at
// once; the other defers for the takeover delay, then checks whether work
// is left and, if so, takes over. Between them there is nothing but
// conditional writes. A replica may be frozen: it neither renews its Lease
// nor runs its passes, and a pass it gathered before it froze is applied
// when it thaws, on the facts it read then.
type replica struct {
	id string
	// skew is how far this replica's clock is ahead of the registry's
	// (negative: behind).
	skew time.Duration
	// pending marks a pass already scheduled per resource.
	pending map[string]bool
	// rng draws the replica's own delays, apart from the world's stream, so
	// that the replicas leave the rest of a round's schedule as it was.
	rng *rand.Rand
	// takeover holds this replica's deferrals (internal/membership).
	takeover *membership.Takeover
	// renewedAt is when the replica last renewed its Lease, by its clock
	// (what its Lease's renewTime says); frozenUntil is when a freeze ends.
	renewedAt, frozenUntil time.Duration
	// cache is the replica's grants cache while it is behind the registry:
	// the grants as they were when the replica froze, until cacheBehind,
	// a moment after it thaws, when its watch has delivered what it
	// missed. nil: the cache is current. The replica reads counters
	// directly, always fresh.
	cache       map[types.UID]*lockingv1alpha1.LockGrant
	cacheBehind time.Duration
}

// Timing of the ownership scheme, as the manager's defaults.
const (
	replicaLeaseDuration = 2 * time.Second
	replicaLeaseRenew    = 500 * time.Millisecond
	replicaTakeover      = 400 * time.Millisecond
	// maxReplicaHop is the longest network hop between a replica's decision
	// and its write landing.
	maxReplicaHop = 40 * time.Millisecond
)

// replicaHop is how long after its decision a replica's write may land:
// 0 in rounds without replicas, whose passes are atomic.
func (w *world) replicaHop() time.Duration {
	if !w.fault[FaultReplicas] {
		return 0
	}
	return maxReplicaHop
}

// between returns a uniformly random duration in [lo, hi] from the
// replica's own stream.
func (rp *replica) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rp.rng.Int64N(int64(hi-lo)+1))
}

// replicaRound reports whether a mixed-schedule round plays two replicas:
// every other round, by a bit of its seed, so that choosing draws nothing
// from the round's random stream.
func replicaRound(seed uint64) bool { return seed>>17&1 == 1 }

// newReplicas returns two replicas whose clocks are skewed within the
// bound, one of them possibly ahead and the other behind, each renewing
// its Lease.
func (w *world) newReplicas() []*replica {
	rs := make([]*replica, 2)
	for i := range rs {
		rp := &replica{
			id: fmt.Sprintf("replica-%d", i), pending: map[string]bool{},
			rng:      rand.New(rand.NewPCG(w.seed, 0x5e11ca+uint64(i))),
			takeover: &membership.Takeover{Delay: replicaTakeover},
		}
		rp.skew = rp.between(-MaxReplicaSkew, MaxReplicaSkew)
		rp.renewedAt = w.s.now + rp.skew
		rs[i] = rp
		w.s.after(replicaLeaseRenew, func() { w.renewReplica(rp) })
	}
	return rs
}

// renewReplica renews rp's Lease every replicaLeaseRenew while it is not
// frozen, and sometimes freezes it for up to three Lease durations.
func (w *world) renewReplica(rp *replica) {
	if w.s.now >= rp.frozenUntil {
		rp.renewedAt = w.s.now + rp.skew
		if rp.rng.Float64() < 0.01 {
			rp.frozenUntil = w.s.now + rp.between(100*time.Millisecond, 3*replicaLeaseDuration)
			w.rep.Faults["replica-freeze"]++
			// Its watch stops with it: after the thaw, its cache shows
			// the grants as they were now until the watch catches up.
			rp.cache = map[types.UID]*lockingv1alpha1.LockGrant{}
			for uid, g := range w.reg.grants {
				rp.cache[uid] = g.DeepCopy()
			}
			rp.cacheBehind = rp.frozenUntil + rp.between(time.Millisecond, 300*time.Millisecond)
		}
	}
	w.s.after(replicaLeaseRenew, func() { w.renewReplica(rp) })
}

// replicaLag is how much later than one replica two replicas with
// ownership may act on a deadline (a session's lapse): the preferred
// replica may be frozen, and the other acts after the takeover delay, or,
// while the resource's state keeps moving, once the frozen replica's Lease
// has lapsed by its clock. 0 in rounds without replicas.
func (w *world) replicaLag() time.Duration {
	if !w.fault[FaultReplicas] {
		return 0
	}
	return replicaLeaseDuration + replicaLeaseRenew + 2*MaxReplicaSkew + replicaTakeover + 15*time.Millisecond
}

// live returns the replicas whose Lease has not lapsed by rp's clock.
func (w *world) live(rp *replica) []string {
	members := make([]membership.Member, 0, len(w.replicas))
	for _, o := range w.replicas {
		members = append(members, membership.Member{ID: o.id, RenewTime: epochBase.Add(o.renewedAt), Duration: replicaLeaseDuration})
	}
	return membership.Live(members, rp.id, epochBase.Add(w.s.now+rp.skew))
}

// pass is what one replica gathered and decided, to be applied later:
// between the two, the other replica may write.
type pass struct {
	resource  string
	counterRV string
	read      map[types.UID]*lockingv1alpha1.LockGrant
	plan      grantplan.Plan
	params    issuer.Params
	// ended are the grants of the resource that had ended (final, asked
	// to be released, or gone) in the registry when the pass read it: the
	// oracle's view, not the replica's.
	ended map[types.UID]bool
}

// grantsView returns the grants as rp's cache shows them at now: nil when
// the cache is current.
func (rp *replica) grantsView(now time.Duration) map[types.UID]*lockingv1alpha1.LockGrant {
	if rp.cache != nil && now >= rp.cacheBehind {
		rp.cache = nil
	}
	return rp.cache
}

// gather reads a resource's grants (from view, a replica's cache that is
// behind, or as they are when view is nil) and its counter (directly, as
// it is), and decides on them at the replica's clock, now+skew, as the
// controller's pass does: the holder's grant is read directly where the
// cache may mislead (grantplan.HolderReadNeeded), and every grant a
// counter write would name as a new holder is read directly before it is
// granted; a cached copy that differs is replaced and the pass gathered
// (the counter read again) and decided again (controllers/lockgrant:
// decide). The replica observed each
// session Lease by its own clock too, so their observation times carry
// the same skew.
func (r *registry) gather(resource string, now, skew time.Duration, view map[types.UID]*lockingv1alpha1.LockGrant) pass {
	ps := pass{resource: resource, ended: map[types.UID]bool{}}
	for uid, g := range view {
		if cur := r.grants[uid]; g.Spec.Resource == resource && (cur == nil || cur.Spec.Release || cur.Status.Phase.Final()) {
			ps.ended[uid] = true
		}
	}
	for uid, g := range r.grants {
		if g.Spec.Resource == resource && (g.Spec.Release || g.Status.Phase.Final()) {
			ps.ended[uid] = true
		}
	}
	ps.params = issuer.Params{Epoch: r.epoch, Revoked: slices.Clone(r.revoked), KeyID: r.keyID, Key: r.key}
	// fresher are the grants read directly because their cached copies
	// were out of date, which replace them from then on; confirmed are
	// those read directly and found as listed.
	fresher := map[types.UID]*lockingv1alpha1.LockGrant{}
	confirmed := map[types.UID]bool{}
	var f grantplan.Facts
	ps.plan = grantplan.Plan{RequeueAfter: replicaCacheCatchUp}
	for range maxConfirmRounds {
		f, ps.counterRV = r.passFacts(resource, now, skew, view, fresher)
		p := grantplan.Decide(f)
		if r.trustCache {
			ps.plan = p
			break
		}
		stale := false
		for _, uid := range newHolders(f, p) {
			if confirmed[uid] {
				continue
			}
			i := slices.IndexFunc(f.Grants, func(g lockingv1alpha1.LockGrant) bool { return g.UID == uid })
			cur := r.grants[uid]
			if cur != nil && sameGrant(&f.Grants[i], cur) {
				confirmed[uid] = true
				continue
			}
			stale = true
			r.staleReads++
			if cur != nil {
				cur = cur.DeepCopy()
			}
			fresher[uid] = cur
		}
		if !stale {
			ps.plan = p
			break
		}
	}
	ps.read = map[types.UID]*lockingv1alpha1.LockGrant{}
	for i := range f.Grants {
		ps.read[f.Grants[i].UID] = f.Grants[i].DeepCopy()
	}
	return ps
}

// passFacts reads what one decision of a pass rests on, in the controller's
// order: the grants from the cache (view, or as they are when view is
// nil), with the copies in fresher in place of the cached ones, then the
// counter directly, then the holder's grant directly where the cache may
// mislead (grantplan.HolderReadNeeded). It returns them with the counter's
// resourceVersion as read.
func (r *registry) passFacts(resource string, now, skew time.Duration, view, fresher map[types.UID]*lockingv1alpha1.LockGrant) (grantplan.Facts, string) {
	cached := r.grants
	if view != nil {
		cached = view
	}
	var grants []lockingv1alpha1.LockGrant
	for uid, g := range cached {
		if _, replaced := fresher[uid]; g.Spec.Resource == resource && !replaced {
			grants = append(grants, *g.DeepCopy())
		}
	}
	for _, g := range fresher {
		if g != nil {
			grants = append(grants, *g.DeepCopy())
		}
	}
	byUID := func(a, b lockingv1alpha1.LockGrant) int { return compareUID(a.UID, b.UID) }
	slices.SortFunc(grants, byUID)
	var counter *lockingv1alpha1.FenceCounter
	rv := ""
	if c := r.counters[resource]; c != nil {
		counter, rv = c.DeepCopy(), c.ResourceVersion
	}
	sessions := r.sessionFacts(now)
	for _, ss := range sessions {
		ss.ObservedAt = ss.ObservedAt.Add(skew)
	}
	revoked := slices.Clone(r.revoked)
	f := grantplan.Facts{
		Now: r.wall(now + skew), Resource: resource, Counter: counter, Grants: grants,
		Epoch: r.epoch, Revoked: revoked, Params: issuer.Params{Epoch: r.epoch, Revoked: revoked, KeyID: r.keyID, Key: r.key},
		Sessions: sessions,
	}
	if h := counter; h != nil && h.Spec.Holder != nil && grantplan.HolderReadNeeded(f.Grants, h.Spec.Holder, f.Now) {
		f.Grants = grantplan.WithHolder(f.Grants, h.Spec.Holder, r.grants[types.UID(h.Spec.Holder.UID)])
		slices.SortFunc(f.Grants, byUID)
	}
	return f, rv
}

// Confirming a new holder, as the controller does (controllers/lockgrant).
const (
	maxConfirmRounds    = 4
	replicaCacheCatchUp = 100 * time.Millisecond
)

// newHolders lists the grants p's counter write names as a new holder.
func newHolders(f grantplan.Facts, p grantplan.Plan) []types.UID {
	var uids []types.UID
	for _, w := range grantplan.CounterWrites(f, p) {
		if h := w.Spec.Holder; h != nil && (f.Counter == nil || f.Counter.Spec.Holder == nil || f.Counter.Spec.Holder.UID != h.UID) {
			uids = append(uids, types.UID(h.UID))
		}
	}
	return uids
}

// sameGrant reports whether a grant as read is its stored version: what
// equal resourceVersions say in the API (the registry keeps one
// resourceVersion for all its objects).
func sameGrant(read, cur *lockingv1alpha1.LockGrant) bool {
	return equality.Semantic.DeepEqual(cur.Spec, read.Spec) && equality.Semantic.DeepEqual(cur.Status, read.Status) &&
		equality.Semantic.DeepEqual(cur.Annotations, read.Annotations)
}

// unchanged is the resourceVersion precondition of a grant's status write:
// the grant is as the pass read it.
func (r *registry) unchanged(ps pass, uid types.UID) (*lockingv1alpha1.LockGrant, bool) {
	cur, was := r.grants[uid], ps.read[uid]
	if cur == nil || was == nil {
		return cur, false
	}
	return cur, sameGrant(was, cur)
}

// writeStatus applies one status write if its precondition holds.
func (r *registry) writeStatus(ps pass, g *lockingv1alpha1.LockGrant) bool {
	cur, ok := r.unchanged(ps, g.UID)
	if !ok {
		return false
	}
	r.setStatus(cur, g)
	return true
}

// apply writes a pass's plan as the LockGrant controller does: the counter
// by compare-and-swap, then the statuses in the plan's order (the ended
// holders, the new holder, the rest), each conditional on the grant as
// read. A failed precondition ends the pass, as a Conflict does; it reports
// whether the pass conflicted.
func (r *registry) apply(ps pass) (requeue time.Duration, conflict bool) {
	p := ps.plan
	c := r.counters[ps.resource]
	curRV := ""
	if c != nil {
		curRV = c.ResourceVersion
	}
	if p.Counter != nil && curRV != ps.counterRV {
		return 0, true // the compare-and-swap fails: the counter moved
	}
	revision := ps.counterRV
	if p.Counter != nil {
		if h := p.Counter.Holder; h != nil && ps.ended[types.UID(h.UID)] && (c == nil || c.Spec.Holder == nil || c.Spec.Holder.UID != h.UID) {
			r.phantoms = append(r.phantoms, types.UID(h.UID))
		}
		revision = r.writeCounter(ps.resource, p)
	}
	if r.crashNext {
		r.crashNext = false
		return time.Millisecond, false
	}
	grantplan.Sign(p, ps.params, revision)
	for _, g := range p.Statuses {
		if !r.writeStatus(ps, g) {
			return time.Millisecond, true
		}
	}
	return p.RequeueAfter, false
}

// kickReplicas schedules a pass over resource on every replica, each after
// its own delay, as both replicas' watches see the same event.
func (w *world) kickReplicas(resource string) {
	if w.replicas == nil {
		w.replicas = w.newReplicas()
		w.rep.Faults[string(FaultReplicas)]++
	}
	for _, rp := range w.replicas {
		w.scheduleReplica(rp, resource, rp.between(time.Millisecond, 15*time.Millisecond))
	}
}

// scheduleReplica schedules rp's step on resource after d, unless one is
// scheduled already (the work queue holds a key once).
func (w *world) scheduleReplica(rp *replica, resource string, d time.Duration) {
	if rp.pending[resource] {
		return
	}
	rp.pending[resource] = true
	w.s.after(d, func() { w.replicaStep(rp, resource) })
}

// replicaStep is the start of rp's reconcile of resource: a frozen replica
// runs it when it thaws; the ownership step decides whether rp acts now,
// defers (a requeue after the delay) or, not preferred and past the delay,
// finds on its own reading that nothing is left to do.
func (w *world) replicaStep(rp *replica, resource string) {
	if w.s.now < rp.frozenUntil {
		w.s.at(rp.frozenUntil, func() { w.replicaStep(rp, resource) })
		return
	}
	rp.pending[resource] = false
	key := namespace + "/" + lockingv1alpha1.FenceCounterName(resource)
	preferred := membership.Preferred(key, w.live(rp)) == rp.id
	wait := rp.takeover.Wait(key, preferred, w.reg.state(resource), epochBase.Add(w.s.now+rp.skew))
	switch {
	case wait > 0:
		w.rep.Faults["replica-deferral"]++
		w.scheduleReplica(rp, resource, wait)
		return
	case !preferred:
		if ps := w.reg.gather(resource, w.s.now, rp.skew, rp.grantsView(w.s.now)); ps.plan.Counter == nil && len(ps.plan.Statuses) == 0 {
			if ps.plan.RequeueAfter > 0 {
				w.s.after(ps.plan.RequeueAfter, func() { w.kick(resource) })
			}
			return
		}
		w.rep.Faults["replica-takeover"]++
	}
	w.replicaPass(rp, resource)
}

// replicaPass gathers and decides at the replica's clock, then applies the
// plan after a network hop, during which the other replica may act, and
// this one may freeze (its plan then lands when it thaws).
func (w *world) replicaPass(rp *replica, resource string) {
	if w.fault[FaultControllerCrash] && rp.rng.Float64() < 0.05 {
		w.reg.crashNext = true
		w.rep.Faults[string(FaultControllerCrash)]++
	}
	view := rp.grantsView(w.s.now)
	if view != nil {
		w.rep.Faults["replica-stale-cache-pass"]++
	}
	ps := w.reg.gather(resource, w.s.now, rp.skew, view)
	var apply func()
	apply = func() {
		if w.s.now < rp.frozenUntil {
			w.rep.Faults["replica-thawed-write"]++
			w.s.at(rp.frozenUntil, apply)
			return
		}
		requeue, conflict := w.reg.apply(ps)
		w.notePhantoms()
		if conflict {
			w.rep.Faults["replica-conflict"]++
			requeue = time.Millisecond
		}
		w.afterPass(resource, requeue)
	}
	w.s.after(rp.between(time.Millisecond, maxReplicaHop), apply)
}

// notePhantoms judges the counter swaps of the pass just applied: none may
// name, as a new holder, a grant that had ended when the pass read it.
func (w *world) notePhantoms() {
	for _, uid := range w.reg.phantoms {
		w.rep.PhantomGrants++
		w.rep.violate("seed %d: a counter swap at %s named %s, which had ended before the pass read it", w.seed, w.s.now, uid)
	}
	w.reg.phantoms = nil
	w.rep.Faults["replica-stale-grant-read"] += w.reg.staleReads
	w.reg.staleReads = 0
}

// state fingerprints a resource as a replica's cache shows it: the
// counter's resourceVersion and each grant's spec and status, summed so
// that the order does not matter.
func (r *registry) state(resource string) uint64 {
	var sum uint64
	if c := r.counters[resource]; c != nil {
		sum = membership.PairHash("counter", c.ResourceVersion)
	}
	for _, g := range r.grants {
		if g.Spec.Resource != resource {
			continue
		}
		sum += membership.PairHash(string(g.UID), fmt.Sprintf("%v|%v|%d|%v|%v", g.Spec.Renewals, g.Spec.Release, g.Status.FenceToken, g.Status.Phase, g.Status.ExpiresAt))
	}
	return sum
}
