package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

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
	// busy marks a resource whose pass is running, from its read to its
	// writes (the work queue never runs a key twice at once); again marks
	// one asked for meanwhile, run once the pass is over.
	busy, again map[string]bool
	// rng draws the replica's own delays, apart from the world's stream, so
	// that the replicas leave the rest of a round's schedule as it was.
	rng *rand.Rand
	// takeover holds this replica's deferrals (internal/membership).
	takeover *membership.Takeover
	// renewedAt is when the replica last renewed its Lease, by its clock
	// (what its Lease's renewTime says); frozenUntil is when a freeze ends.
	renewedAt, frozenUntil time.Duration
	// cache is the replica's informers of grants and counters, its own
	// writes they have not delivered yet, and its status writer
	// (caches.go). Its watches deliver nothing while it is frozen, and
	// what they missed within a moment after it thaws.
	cache *replicaCache
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
			id: fmt.Sprintf("replica-%d", i), pending: map[string]bool{}, busy: map[string]bool{}, again: map[string]bool{},
			rng:      rand.New(rand.NewPCG(w.seed, 0x5e11ca+uint64(i))),
			takeover: &membership.Takeover{Delay: replicaTakeover},
		}
		rp.skew = rp.between(-MaxReplicaSkew, MaxReplicaSkew)
		rp.renewedAt = w.s.now + rp.skew
		rp.cache = newReplicaCache(w.reg)
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
			// Its watches stop with it: after the thaw, its caches show
			// the grants and counters as they were now until the
			// watches catch up.
			rp.cache.catchUp = rp.between(time.Millisecond, 300*time.Millisecond)
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
	f         grantplan.Facts
	plan      grantplan.Plan
	params    issuer.Params
	// direct says the counter was read directly, not from the cache.
	direct bool
	// drops is the replica's count of dropped status queues of the
	// resource when the pass read it.
	drops int
	// ended are the grants of the resource that had ended (final, asked
	// to be released, or gone) in the registry when the pass read it: the
	// oracle's view, not the replica's.
	ended map[types.UID]bool
}

// readMode says where a pass reads the counter, as the controller's
// (controllers/lockgrant: readMode).
type readMode int

const (
	// cacheOnly reads everything from rp's cache: ownership's check.
	cacheOnly readMode = iota
	// cachedCounters reads the counter from the cache, with rp's own
	// write in place of an older copy.
	cachedCounters
	// directCounters reads the counter as stored.
	directCounters
)

// gather reads a resource's grants from rp's cache (with its own statuses
// in place of older copies) and its counter as mode says, and decides on
// them at the replica's clock, now+skew, as the controller's pass does:
// the holder's grant is read directly where the cache may mislead
// (grantplan.HolderReadNeeded), and every grant a counter write would name
// as a new holder is read directly before it is granted; a cached copy
// that differs is replaced and the pass decided again (controllers/
// lockgrant: decide). Every grant the plan ends while its copy reads Held
// and no counter names it is read directly too (grantplan.EndsUnnamed):
// when its cached copy differs, the pass writes nothing for it and asks for
// a pass after replicaCacheCatchUp. The replica observed each session
// Lease by its own clock too, so their observation times carry the same
// skew.
func (w *world) gather(rp *replica, resource string, mode readMode) pass {
	r, now, skew := w.reg, w.s.now, rp.skew
	cached := rp.cachedGrants(resource)
	ps := pass{resource: resource, ended: map[types.UID]bool{}, direct: mode == directCounters, drops: rp.cache.drops[resource]}
	for uid := range cached {
		if cur := r.grants[uid]; cur == nil || cur.Spec.Release || cur.Status.Phase.Final() {
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
	// those read directly and found as listed, with the resourceVersion
	// of the copy the pass decided on (a later round may decide on
	// another copy: that one is read again, as the controller does).
	fresher := map[types.UID]*lockingv1alpha1.LockGrant{}
	confirmed := map[types.UID]string{}
	var behind []types.UID // ended unnamed on a copy out of date
	ps.plan = grantplan.Plan{RequeueAfter: replicaCacheCatchUp}
	listed := false
	for range maxConfirmRounds {
		f, rv := w.passFacts(rp, resource, now, skew, cached, fresher, mode)
		p := grantplan.Decide(f)
		ps.f, ps.counterRV = f, rv
		if r.trustCache || mode == cacheOnly {
			ps.plan = p
			break
		}
		if !listed && !r.skipDirectList && len(grantplan.NewlyHeld(f, p)) > 0 && w.needsList(rp, f, p) {
			// The direct list of the resource's grants before a Held
			// status for a grant not Held before (controllers/lockgrant:
			// listDirect), unless the grants cache has caught up to the
			// counters; then the counter is read directly again.
			listed = true
			if w.listDirect(rp, resource, f, fresher, confirmed) {
				r.staleReads++
				mode = directCounters
				ps.direct = true
				continue
			}
		}
		// rvOf is the resourceVersion of the copy of grant uid the pass
		// decided on; asListed reads the grant directly: whether it is
		// as the pass listed it, or behind it only by rp's own status
		// write.
		rvOf := func(uid types.UID) string {
			i := slices.IndexFunc(f.Grants, func(g lockingv1alpha1.LockGrant) bool { return g.UID == uid })
			return f.Grants[i].ResourceVersion
		}
		asListed := func(uid types.UID) bool {
			cur := r.grants[uid]
			return cur != nil && (cur.ResourceVersion == rvOf(uid) || rp.wrote(uid, cur.ResourceVersion))
		}
		stale := false
		for _, uid := range grantplan.NewHolders(f, p) {
			if confirmed[uid] == rvOf(uid) {
				continue
			}
			if asListed(uid) {
				confirmed[uid] = rvOf(uid)
				continue
			}
			stale = true
			r.staleReads++
			fresher[uid] = rp.overlay(r.grants[uid].DeepCopy())
		}
		// A grant the plan ends while its copy reads Held and no counter
		// names it is read directly too: on a copy behind the stored one
		// the pass writes nothing for it, and asks for a pass once the
		// cache has caught up.
		for _, uid := range grantplan.EndsUnnamed(f, p) {
			if confirmed[uid] == rvOf(uid) || slices.Contains(behind, uid) {
				continue
			}
			if asListed(uid) {
				confirmed[uid] = rvOf(uid)
				continue
			}
			r.unnamedReads++
			behind = append(behind, uid)
		}
		if !stale {
			ps.plan = grantplan.Without(p, behind)
			if len(behind) > 0 && (ps.plan.RequeueAfter == 0 || ps.plan.RequeueAfter > replicaCacheCatchUp) {
				ps.plan.RequeueAfter = replicaCacheCatchUp
			}
			break
		}
	}
	return ps
}

// needsList is the controller's rule for the direct list before a Held
// status (grantplan.CacheCovers on the mark of rp's grants cache, unless
// grantplan.MayHideLateHeld), counted both ways.
func (w *world) needsList(rp *replica, f grantplan.Facts, p grantplan.Plan) bool {
	if grantplan.CacheCovers(f, rp.cache.seen()) && !grantplan.MayHideLateHeld(f, p) {
		w.rep.Faults["replica-held-on-caught-up-cache"]++
		return false
	}
	w.rep.Faults["replica-direct-list"]++
	return true
}

// listDirect is the controller's direct list of resource's grants: every
// gathered grant that differs from its stored version (other than by rp's
// own status write), is missing, or is gone, goes into fresher; the others
// are confirmed as gathered. It reports whether it found one.
func (w *world) listDirect(rp *replica, resource string, f grantplan.Facts, fresher map[types.UID]*lockingv1alpha1.LockGrant, confirmed map[types.UID]string) bool {
	stale := false
	stored := map[types.UID]bool{}
	for uid, g := range w.reg.grants {
		if g.Spec.Resource != resource {
			continue
		}
		stored[uid] = true
		i := slices.IndexFunc(f.Grants, func(c lockingv1alpha1.LockGrant) bool { return c.UID == uid })
		if i >= 0 && (f.Grants[i].ResourceVersion == g.ResourceVersion || rp.wrote(uid, g.ResourceVersion)) {
			confirmed[uid] = f.Grants[i].ResourceVersion
			continue
		}
		stale = true
		fresher[uid] = rp.overlay(g.DeepCopy())
	}
	for i := range f.Grants {
		if uid := f.Grants[i].UID; !stored[uid] {
			stale = true
			fresher[uid] = nil
		}
	}
	return stale
}

// wrote reports whether rv is the version rp's own status write of grant
// uid produced.
func (rp *replica) wrote(uid types.UID, rv string) bool {
	o := rp.cache.ownStatuses[uid]
	return o != nil && o.written != "" && o.written == rv
}

// passFacts reads what one decision of a pass rests on, in the controller's
// order: the grants from the cache (cached), with the copies in fresher in
// place of the cached ones, then the counter (from the cache, with rp's
// own write in place of an older copy, or as stored), then the holder's
// grant directly where the cache may mislead (grantplan.HolderReadNeeded).
// It returns them with the counter's resourceVersion as read.
func (w *world) passFacts(rp *replica, resource string, now, skew time.Duration, cached, fresher map[types.UID]*lockingv1alpha1.LockGrant, mode readMode) (grantplan.Facts, string) {
	r := w.reg
	// Copies of the structs will do: nothing changes a cached grant or
	// one in fresher in place (a delivery replaces a cached grant), and
	// Decide copies what it changes.
	list := make([]*lockingv1alpha1.LockGrant, 0, len(cached)+len(fresher))
	for uid, g := range cached {
		if _, replaced := fresher[uid]; !replaced {
			list = append(list, g)
		}
	}
	for _, g := range fresher {
		if g != nil {
			list = append(list, g)
		}
	}
	slices.SortFunc(list, func(a, b *lockingv1alpha1.LockGrant) int { return compareUID(a.UID, b.UID) })
	var grants []lockingv1alpha1.LockGrant
	if len(list) > 0 {
		grants = make([]lockingv1alpha1.LockGrant, 0, len(list)+1)
		for _, g := range list {
			grants = append(grants, *g)
		}
	}
	byUID := func(a, b lockingv1alpha1.LockGrant) int { return compareUID(a.UID, b.UID) }
	var counter *lockingv1alpha1.FenceCounter
	switch mode {
	case directCounters:
		counter = r.counters[resource]
		if o := rp.cache.ownCounters[resource]; o != nil && (counter == nil || counter.ResourceVersion != o.ResourceVersion) {
			delete(rp.cache.ownCounters, resource) // moved on since
		}
	default:
		counter = rp.cachedCounter(resource)
	}
	rv := ""
	if counter != nil {
		counter, rv = counter.DeepCopy(), counter.ResourceVersion
	}
	sessions := r.sessionFacts(now)
	for _, ss := range sessions {
		ss.ObservedAt = ss.ObservedAt.Add(skew)
	}
	revoked := slices.Clone(r.revoked)
	f := grantplan.Facts{
		Now: r.wall(now + skew), Resource: resource, Counter: counter, Grants: grants,
		Epoch: r.epoch, Revoked: revoked,
		Sessions: sessions,
	}
	if h := counter; h != nil && h.Spec.Holder != nil && grantplan.HolderReadNeeded(f.Grants, h.Spec.Holder, f.Now) {
		read := r.grants[types.UID(h.Spec.Holder.UID)]
		if mode == cacheOnly {
			read = rp.cache.grants[types.UID(h.Spec.Holder.UID)]
		}
		if read != nil {
			read = rp.overlay(read.DeepCopy())
		}
		f.Grants = grantplan.WithHolder(f.Grants, h.Spec.Holder, read)
		slices.SortFunc(f.Grants, byUID)
	}
	return f, rv
}

// Confirming a new holder, and conflicts, as the controller does
// (controllers/lockgrant).
const (
	maxConfirmRounds    = 4
	replicaCacheCatchUp = 100 * time.Millisecond
	maxPassRounds       = 5
)

// apply writes a pass's plan as the LockGrant controller does: the counter
// by compare-and-swap, then hands the statuses, in the plan's order (the
// ended holders, the new holder, the rest), to the replica's status writer.
// It reports whether the compare-and-swap conflicted: the pass is then
// decided again on a direct read; and whether the replica's writer dropped
// statuses of the resource since the pass read it: its statuses are then
// not queued, and it is decided again.
func (w *world) applyPass(rp *replica, ps pass) (requeue time.Duration, conflict, dropped bool) {
	r := w.reg
	p := ps.plan
	c := r.counters[ps.resource]
	curRV := ""
	if c != nil {
		curRV = c.ResourceVersion
	}
	if p.Counter != nil && curRV != ps.counterRV {
		return 0, true, false // the compare-and-swap fails: the counter moved
	}
	revision, generation := ps.counterRV, int64(0)
	if ps.f.Counter != nil {
		generation = ps.f.Counter.Generation // the counter it decided on
	}
	if p.Counter != nil {
		if h := p.Counter.Holder; h != nil && ps.ended[types.UID(h.UID)] && (c == nil || c.Spec.Holder == nil || c.Spec.Holder.UID != h.UID) {
			r.phantoms = append(r.phantoms, types.UID(h.UID))
		}
		revision = r.writeCounter(ps.resource, p)
		written := r.counters[ps.resource]
		generation = written.Generation
		rp.cache.ownCounters[ps.resource] = written.DeepCopy()
	}
	if r.crashNext {
		// The process dies between the counter write and its statuses:
		// what it planned and had not written is lost, and its
		// informers list afresh when it comes back.
		r.crashNext = false
		for res := range rp.cache.writers {
			for _, it := range rp.cache.writers[res] {
				delete(rp.cache.ownStatuses, it.grant.UID)
			}
		}
		clear(rp.cache.writers)
		clear(rp.cache.ownStatuses)
		clear(rp.cache.ownCounters)
		rp.cache.relist(r)
		return time.Millisecond, false, false
	}
	for _, sg := range grantplan.Sign(p, ps.params, revision) {
		sg.Grant.Status.Record, sg.Grant.Status.Proof = sg.Record, sg.Proof
	}
	for _, g := range p.Statuses {
		g.Status.CounterGeneration = generation
	}
	if len(p.Statuses) > 0 && rp.cache.drops[ps.resource] != ps.drops {
		return 0, false, true
	}
	w.enqueueStatuses(rp, ps.resource, p.Statuses)
	return p.RequeueAfter, false, false
}

// kickReplicas schedules a pass over resource on every replica, each after
// its own delay, as both replicas' watches see the same event.
func (w *world) kickReplicas(resource string) {
	if w.replicas == nil {
		w.replicas = w.newReplicas()
		w.reg.onGrant, w.reg.onCounterWrite = w.publishGrant, w.publishCounter
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
	if rp.busy[resource] {
		rp.again[resource] = true
		return
	}
	key := namespace + "/" + lockingv1alpha1.FenceCounterName(resource)
	preferred := membership.Preferred(key, w.live(rp)) == rp.id
	wait := rp.takeover.Wait(key, preferred, rp.state(resource), epochBase.Add(w.s.now+rp.skew))
	switch {
	case wait > 0:
		w.rep.Faults["replica-deferral"]++
		w.scheduleReplica(rp, resource, wait)
		return
	case !preferred:
		if ps := w.gather(rp, resource, cacheOnly); ps.plan.Empty() {
			if ps.plan.RequeueAfter > 0 {
				w.s.after(ps.plan.RequeueAfter, func() { w.kick(resource) })
			}
			return
		}
		w.rep.Faults["replica-takeover"]++
	}
	rp.busy[resource] = true
	w.replicaPass(rp, resource)
}

// passDone ends rp's pass over resource, and starts the one asked for
// meanwhile.
func (w *world) passDone(rp *replica, resource string) {
	rp.busy[resource] = false
	if rp.again[resource] {
		rp.again[resource] = false
		w.scheduleReplica(rp, resource, 0)
	}
}

// replicaPass gathers and decides at the replica's clock, on its caches,
// then applies the plan after a network hop, during which the other
// replica may act, and this one may freeze (its plan then lands when it
// thaws). A plan no compare-and-swap validates is decided again on a
// direct read of the counter first; a compare-and-swap that conflicts
// decides the pass again at once on a direct read, up to maxPassRounds.
func (w *world) replicaPass(rp *replica, resource string) {
	if w.fault[FaultControllerCrash] && rp.rng.Float64() < 0.05 {
		w.reg.crashNext = true
		w.rep.Faults[string(FaultControllerCrash)]++
	}
	w.passRound(rp, resource, 1, cachedCounters)
}

func (w *world) passRound(rp *replica, resource string, round int, mode readMode) {
	if rp.behind(w.reg, resource) {
		w.rep.Faults["replica-stale-cache-pass"]++
	}
	ps := w.gather(rp, resource, mode)
	if mode == cachedCounters {
		if c := w.reg.counters[resource]; rvOf(c) != ps.counterRV {
			w.rep.Faults["replica-stale-counter-pass"]++
		}
		if !validated(ps.f, ps.plan) {
			w.rep.Faults["replica-direct-read"]++
			ps = w.gather(rp, resource, directCounters)
		}
	}
	var apply func()
	apply = func() {
		if w.s.now < rp.frozenUntil {
			w.rep.Faults["replica-thawed-write"]++
			w.s.at(rp.frozenUntil, apply)
			return
		}
		requeue, conflict, dropped := w.applyPass(rp, ps)
		w.notePhantoms()
		switch {
		case conflict:
			w.rep.Faults["replica-conflict"]++
			if round < maxPassRounds {
				w.passRound(rp, resource, round+1, directCounters)
				return
			}
			requeue = time.Millisecond
		case dropped:
			w.rep.Faults["replica-statuses-redecided"]++
			if round < maxPassRounds {
				w.passRound(rp, resource, round+1, mode)
				return
			}
			requeue = 50 * time.Millisecond
		}
		w.passDone(rp, resource)
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
	w.rep.Faults["replica-stale-unnamed-read"] += w.reg.unnamedReads
	w.reg.staleReads, w.reg.unnamedReads = 0, 0
}

// state fingerprints a resource as rp's cache shows it: the counter's
// resourceVersion and each grant's, summed so that the order does not
// matter.
func (rp *replica) state(resource string) uint64 {
	var sum uint64
	if c := rp.cache.counters[resource]; c != nil {
		sum = membership.PairHash("counter", c.ResourceVersion)
	}
	for uid, g := range rp.cache.grants {
		if g.Spec.Resource == resource {
			sum += membership.PairHash(string(uid), g.ResourceVersion)
		}
	}
	return sum
}

// behind reports whether rp's cache shows an older version of one of
// resource's grants than is stored, or misses one.
func (rp *replica) behind(r *registry, resource string) bool {
	for uid, g := range r.grants {
		if g.Spec.Resource != resource {
			continue
		}
		if c := rp.cache.grants[uid]; c == nil || c.ResourceVersion != g.ResourceVersion {
			return true
		}
	}
	return false
}
