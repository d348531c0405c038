package sim

import (
	"crypto/ed25519"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// FaultSemaphore plays a resource with permits (LockGrantSpec.Permits)
// instead of an exclusive lock: workers ask for N permits, N shrinks and
// grows mid-round, each holder writes to the store of its slot (and now and
// then, by mistake, to another slot's), and the round's other faults that
// apply to it play along: pause (writes that arrive after the lease),
// controller-crash (a pass stops between the counter writes and the status
// writes), lock-delay, and replicas (a second decider that applies plans
// made on an older read, which can grant one waiter two slots, and that
// now and then freezes and, thawed, decides on a grants cache that is
// behind, reading the counters fresh). Not in Faults: one mixed-schedule
// round in eight plays it (semaphoreRound).
const FaultSemaphore Fault = "semaphore"

// semaphoreRound reports whether a mixed-schedule round plays a resource
// with permits.
func semaphoreRound(seed uint64) bool { return seed>>23&7 == 0 }

// semWorld is one semaphore round: the registry (grants and one counter per
// slot), the slots' stores, the workers, the deciders and the oracle.
type semWorld struct {
	seed     uint64
	s        scheduler
	rng      *rand.Rand
	rep      *Report
	fault    map[Fault]bool
	resource string
	horizon  time.Duration
	key      ed25519.PrivateKey

	// grants are the stored grants. A stored grant is never changed in
	// place: every write stores a new version (update), so the grants as
	// they were at some moment are a copy of this map, and a pass lists
	// them without copying each.
	grants   map[types.UID]*lockingv1alpha1.LockGrant
	counters map[string]*lockingv1alpha1.FenceCounter // by fenced resource ID
	rv, uids int64
	// uidOrder are the grants' UIDs in order (grantUIDs).
	uidOrder []types.UID
	// limit is the permits that new requests name.
	limit int32
	// past are the counters as they were at the last few ticks, newest
	// first: what a decider that reads the counters one by one, some
	// before and some after a change, may see.
	past []map[string]*lockingv1alpha1.FenceCounter
	// pastGrants are the grants as they were at the same ticks.
	pastGrants []map[types.UID]*lockingv1alpha1.LockGrant

	// stores are the slots' protected resources: the last fence each
	// accepted, and from which grant.
	stores     map[string]int64
	storeGrant map[string]types.UID

	// The oracle's history, kept apart from the registry and the verifier.
	issued     map[string]int64 // highest fence ever issued per fenced resource
	ever       map[types.UID]bool
	heldSince  map[types.UID]time.Duration
	endedAt    map[types.UID]time.Duration
	expiresAt  map[types.UID]time.Duration
	slotOf     map[types.UID]string
	delayUntil map[string]time.Duration
	createdAt  map[types.UID]time.Duration
	issuedAt   map[types.UID]time.Duration

	// second is the second decider of a round with FaultReplicas.
	second staleDecider
	// freezeChance is the second decider's chance to freeze at each tick:
	// semFreezeChance, unless a test raises it.
	freezeChance float64
	// trustCache makes the deciders grant on their cache's copy of a grant
	// without reading it directly first (tests only).
	trustCache bool

	// forget breaks the controller's lock-delay on slots (tests only).
	forget forgetting
}

// staleDecider is the state of the second decider, a manager replica
// beside the one that decides every tick: it may be frozen (it runs no
// pass, and a plan it made before lands when it thaws), and after a thaw
// its grants cache shows the grants as they were when it froze until its
// watch catches up, while it reads counters directly, fresh. Its draws
// come from a stream of its own.
type staleDecider struct {
	rng *rand.Rand
	// frozenUntil is when a freeze ends; cache, the grants as they were
	// when it froze, is its view of them until cacheBehind (nil: the
	// cache is current).
	frozenUntil, cacheBehind time.Duration
	cache                    map[types.UID]*lockingv1alpha1.LockGrant
}

// between returns a uniformly random duration in [lo, hi] from the
// decider's own stream.
func (d *staleDecider) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(d.rng.Int64N(int64(hi-lo)+1))
}

// cacheView returns the grants as the decider's cache shows them at now,
// nil when the cache is current.
func (d *staleDecider) cacheView(now time.Duration) map[types.UID]*lockingv1alpha1.LockGrant {
	if d.cache != nil && now >= d.cacheBehind {
		d.cache = nil
	}
	return d.cache
}

// forgetting is a way a broken controller forgets a slot's lock-delay.
type forgetting int

const (
	// forgetNone: the controller as it is.
	forgetNone forgetting = iota
	// forgetAll stores every slot counter without its lock-delay.
	forgetAll
	// forgetDoubled frees a slot without its lock-delay when the grant it
	// names is named by another slot's counter too: a waiter two racing
	// deciders granted two slots.
	forgetDoubled
)

func newSemWorld(seed uint64, faults []Fault) *semWorld {
	k := make([]byte, ed25519.SeedSize)
	copy(k, strconv.FormatUint(seed, 16))
	w := &semWorld{
		seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x5e3a)), rep: newReport(), fault: map[Fault]bool{},
		resource: "batch/nightly", horizon: 40 * time.Second, key: ed25519.NewKeyFromSeed(k),
		grants: map[types.UID]*lockingv1alpha1.LockGrant{}, counters: map[string]*lockingv1alpha1.FenceCounter{},
		stores: map[string]int64{}, storeGrant: map[string]types.UID{},
		issued: map[string]int64{}, ever: map[types.UID]bool{}, heldSince: map[types.UID]time.Duration{},
		endedAt: map[types.UID]time.Duration{}, expiresAt: map[types.UID]time.Duration{}, slotOf: map[types.UID]string{},
		delayUntil: map[string]time.Duration{}, createdAt: map[types.UID]time.Duration{}, issuedAt: map[types.UID]time.Duration{},
	}
	for _, f := range faults {
		w.fault[f] = true
	}
	w.limit = 1 + w.rng.Int32N(4)
	w.second.rng = rand.New(rand.NewPCG(seed, 0x5e11ca))
	w.freezeChance = semFreezeChance
	return w
}

func (w *semWorld) wall(t time.Duration) time.Time { return epochBase.Add(t) }

func (w *semWorld) run() *Report {
	w.rep.Rounds = 1
	w.rep.Faults[string(FaultSemaphore)]++
	workers := 2 + w.rng.IntN(6)
	for i := range workers {
		w.s.after(time.Duration(w.rng.IntN(500))*time.Millisecond, func() { w.acquire(fmt.Sprintf("worker-%d", i)) })
	}
	w.s.after(0, w.tick)
	w.s.after(time.Duration(2+w.rng.IntN(5))*time.Second, w.changeLimit)
	w.s.run(w.horizon)
	return w.rep
}

// changeLimit has new requests name another number of permits.
func (w *semWorld) changeLimit() {
	n := 1 + w.rng.Int32N(5)
	switch {
	case n < w.limit:
		w.rep.Faults["semaphore-shrink"]++
	case n > w.limit:
		w.rep.Faults["semaphore-grow"]++
	}
	w.limit = n
	w.s.after(time.Duration(2+w.rng.IntN(6))*time.Second, w.changeLimit)
}

// tick runs the controller's passes: the primary decider every 100 ms, and
// with FaultReplicas a second one that applies what it decided on an older
// read, or on a stale cache after a freeze.
func (w *semWorld) tick() {
	w.apply(w.gather(false))
	if w.fault[FaultReplicas] {
		w.freezeSecond()
		w.remember()
	}
	if w.fault[FaultReplicas] && w.rng.IntN(3) == 0 && w.s.now >= w.second.frozenUntil {
		ps := w.gather(true)
		w.applySecond(ps, time.Duration(10+w.rng.IntN(300))*time.Millisecond)
	}
	w.s.after(100*time.Millisecond, w.tick)
}

// remember keeps the counters and the grants as they are now, newest
// first, with those of the last three ticks: what a decider whose reads lag
// may read (gather).
func (w *semWorld) remember() {
	snap := map[string]*lockingv1alpha1.FenceCounter{}
	for id, c := range w.counters {
		snap[id] = c.DeepCopy()
	}
	w.past = append([]map[string]*lockingv1alpha1.FenceCounter{snap}, w.past[:min(len(w.past), 3)]...)
	gs := maps.Clone(w.grants) // stored grants are never changed in place
	w.pastGrants = append([]map[types.UID]*lockingv1alpha1.LockGrant{gs}, w.pastGrants[:min(len(w.pastGrants), 3)]...)
}

// Freezes of the second decider: about one in 50 s, each up to three
// replica Lease durations, its watch delivering what it missed up to
// 300 ms after it thaws, as replicas.go plays them for exclusive locks.
const semFreezeChance = 0.002

// freezeSecond now and then freezes the second decider. Its watch stops
// with it: until a moment after the thaw its cache shows the grants as
// they are now. When it thaws it runs the pass its queue holds at once, on
// that cache and on counters read fresh.
func (w *semWorld) freezeSecond() {
	d := &w.second
	if w.s.now < d.frozenUntil || d.rng.Float64() >= w.freezeChance {
		return
	}
	d.frozenUntil = w.s.now + d.between(100*time.Millisecond, 3*replicaLeaseDuration)
	d.cache = maps.Clone(w.grants) // stored grants are never changed in place
	d.cacheBehind = d.frozenUntil + d.between(time.Millisecond, 300*time.Millisecond)
	w.rep.Faults["semaphore-replica-freeze"]++
	w.s.at(d.frozenUntil, func() {
		w.applySecond(w.gather(true), d.between(time.Millisecond, maxReplicaHop))
	})
}

// applySecond applies the second decider's pass after delay, or, when the
// decider is frozen by then, when it thaws.
func (w *semWorld) applySecond(ps semPass, delay time.Duration) {
	var apply func()
	apply = func() {
		if w.s.now < w.second.frozenUntil {
			w.rep.Faults["semaphore-thawed-write"]++
			w.s.at(w.second.frozenUntil, apply)
			return
		}
		w.rep.Faults["semaphore-stale-decider"]++
		w.apply(ps)
	}
	w.s.after(delay, apply)
}

// semPass is one pass's read of the registry and its plan.
type semPass struct {
	f    grantplan.Facts
	plan grantplan.Plan
	// counterRV is each slot counter's resourceVersion as read; "" absent.
	counterRV map[int32]string
	// at is when the pass read and decided.
	at time.Duration
	// ended are the grants that had ended (final, or asked to be
	// released) in the registry as of the pass's counter read: the
	// oracle's view, not the decider's.
	ended map[types.UID]bool
}

// gather lists the grants and decides on them (decide). As the
// controller does, a pass reads the grants (from a cache, perhaps behind)
// before the counters (directly), so a counter is never older than a grant
// read with it. A stale gather reads the counters as they are or as they
// were a few ticks ago, and each grant as it was then or earlier, as a
// decider whose reads straddle changes would; after a freeze, the second
// decider lists the grants from its cache, as they were when it froze, and
// reads the counters as they are.
func (w *semWorld) gather(stale bool) semPass {
	if cache := w.second.cacheView(w.s.now); stale && cache != nil {
		w.rep.Faults["semaphore-stale-cache-pass"]++
		listed := make([]*lockingv1alpha1.LockGrant, 0, len(cache))
		for _, uid := range slices.SortedFunc(maps.Keys(cache), compareUID) {
			listed = append(listed, cache[uid])
		}
		return w.decide(listed, -1)
	}
	// lag is how many ticks behind the counters are read: -1 as they are.
	lag := -1
	if stale && len(w.past) > 0 && w.rng.IntN(2) == 0 {
		lag = w.rng.IntN(len(w.past))
	}
	listed := make([]*lockingv1alpha1.LockGrant, 0, len(w.grants))
	for _, uid := range w.grantUIDs() {
		g := w.grants[uid]
		if stale && len(w.pastGrants) > max(lag, 0) && (lag >= 0 || w.rng.IntN(2) == 0) {
			if old := w.pastGrants[max(lag, 0)+w.rng.IntN(len(w.pastGrants)-max(lag, 0))][uid]; old != nil {
				g = old
			} else if lag >= 0 {
				continue // not created yet as of the counters' read
			}
		}
		listed = append(listed, g)
	}
	return w.decide(listed, lag)
}

// decide reads what the controller reads beside the grants listed
// (counters of every slot below the largest permits a live grant names,
// and every slot a live grant holds, as they are or, lag ≥ 0, as they were
// lag ticks ago) and decides, as the controller's pass does: each counter's
// holder is read directly where the cache may mislead, and every grant a
// counter write would name as a new holder is read directly before it is
// granted, after the counters; a listed copy that differs is replaced and
// the pass gathered and decided again (controllers/lockgrant: decide). A
// direct read returns the grant as of the counters' read.
func (w *semWorld) decide(listed []*lockingv1alpha1.LockGrant, lag int) semPass {
	direct := w.grants
	if lag >= 0 {
		direct = w.pastGrants[lag]
	}
	ps := semPass{at: w.s.now, ended: map[types.UID]bool{}}
	for uid, g := range direct {
		if g.Spec.Release || g.Status.Phase.Final() {
			ps.ended[uid] = true
		}
	}
	// fresher are the grants read directly because their listed copies
	// were out of date, which replace them from then on (nil: gone);
	// confirmed are those read directly and found as listed.
	fresher := map[types.UID]*lockingv1alpha1.LockGrant{}
	confirmed := map[types.UID]string{}
	for range maxConfirmRounds {
		f, rvs := w.passFacts(listed, fresher, lag, direct)
		p := grantplan.Decide(f)
		if w.trustCache {
			ps.f, ps.plan, ps.counterRV = f, p, rvs
			return ps
		}
		stale := false
		for _, uid := range slotNewHolders(f, p) {
			i := slices.IndexFunc(f.Grants, func(g lockingv1alpha1.LockGrant) bool { return g.UID == uid })
			if confirmed[uid] == f.Grants[i].ResourceVersion {
				continue
			}
			if cur := direct[uid]; cur != nil && cur.ResourceVersion == f.Grants[i].ResourceVersion {
				confirmed[uid] = cur.ResourceVersion
				continue
			}
			stale = true
			w.rep.Faults["semaphore-stale-grant-read"]++
			fresher[uid] = nil
			if cur := direct[uid]; cur != nil {
				fresher[uid] = cur.DeepCopy()
			}
		}
		if !stale {
			ps.f, ps.plan, ps.counterRV = f, p, rvs
			return ps
		}
	}
	// The cache stayed behind: the pass writes nothing and is decided
	// again later.
	return ps
}

// passFacts reads what one decision of a pass rests on: the grants listed,
// with the copies in fresher in their place, the counters (lag ticks ago,
// or as they are), and each counter's holder grant directly where the
// cache may mislead, as the controller's refreshHolder does, from direct.
// It returns them with each slot counter's resourceVersion as read.
func (w *semWorld) passFacts(listed []*lockingv1alpha1.LockGrant, fresher map[types.UID]*lockingv1alpha1.LockGrant, lag int, direct map[types.UID]*lockingv1alpha1.LockGrant) (grantplan.Facts, map[int32]string) {
	f := grantplan.Facts{Now: w.wall(w.s.now), Resource: w.resource, Epoch: 0}
	if len(listed) > 0 {
		f.Grants = make([]lockingv1alpha1.LockGrant, 0, len(listed)+1)
	}
	for _, g := range listed {
		if fresh, replaced := fresher[g.UID]; replaced {
			if fresh == nil {
				continue
			}
			g = fresh
		}
		f.Grants = append(f.Grants, *g)
	}
	want := map[int32]bool{}
	for i := range f.Grants {
		g := &f.Grants[i]
		if g.Status.Phase.Final() {
			continue
		}
		for k := int32(1); k < g.Spec.EffectivePermits(); k++ {
			want[k] = true
		}
		if k := g.HeldSlot(); k > 0 {
			want[k] = true
		}
	}
	rvs := map[int32]string{}
	read := func(id string) *lockingv1alpha1.FenceCounter {
		if lag >= 0 {
			return w.past[lag][id]
		}
		return w.counters[id]
	}
	if c := read(w.resource); c != nil {
		f.Counter = c.DeepCopy()
		rvs[0] = c.ResourceVersion
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if c := read(lockingv1alpha1.SlotResource(w.resource, k)); c != nil {
			if f.SlotCounters == nil {
				f.SlotCounters = map[int32]*lockingv1alpha1.FenceCounter{}
			}
			f.SlotCounters[k] = c.DeepCopy()
			rvs[k] = c.ResourceVersion
		}
	}
	refreshHolder(&f, f.Counter, direct)
	for _, k := range slices.Sorted(maps.Keys(f.SlotCounters)) {
		refreshHolder(&f, f.SlotCounters[k], direct)
	}
	return f, rvs
}

// slotNewHolders lists the grants p's counter writes name as a new holder
// of their slot: those the pass grants.
func slotNewHolders(f grantplan.Facts, p grantplan.Plan) []types.UID {
	var uids []types.UID
	for _, cw := range grantplan.CounterWrites(f, p) {
		cur := f.Counter
		if cw.Slot > 0 {
			cur = f.SlotCounters[cw.Slot]
		}
		if h := cw.Spec.Holder; h != nil && (cur == nil || cur.Spec.Holder == nil || cur.Spec.Holder.UID != h.UID) {
			uids = append(uids, types.UID(h.UID))
		}
	}
	return uids
}

// refreshHolder reads counter c's holder grant from direct when the
// controller would (grantplan.HolderReadNeeded), and puts it in the list.
func refreshHolder(f *grantplan.Facts, c *lockingv1alpha1.FenceCounter, direct map[types.UID]*lockingv1alpha1.LockGrant) {
	if c == nil || c.Spec.Holder == nil || !grantplan.HolderReadNeeded(f.Grants, c.Spec.Holder, f.Now) {
		return
	}
	f.Grants = grantplan.WithHolder(f.Grants, c.Spec.Holder, direct[types.UID(c.Spec.Holder.UID)])
}

// grantUIDs lists the grants' UIDs in order (compareUID). A round never
// deletes a grant, and UIDs are numbered as they are made, so the list is
// the order they were made in (request); callers must not change it.
func (w *semWorld) grantUIDs() []types.UID {
	if len(w.uidOrder) != len(w.grants) {
		w.uidOrder = slices.SortedFunc(maps.Keys(w.grants), compareUID)
	}
	return w.uidOrder
}

// apply writes a plan as the controller does: each counter by
// compare-and-swap (in grantplan.CounterWrites' order), each conditional on
// the version read, then the statuses in the plan's order (ended holders
// first); a conflict ends the pass.
func (w *semWorld) apply(ps semPass) {
	p := ps.plan
	statuses := p.Statuses
	writes := grantplan.CounterWrites(ps.f, p)
	revs := map[int32]string{}
	for k, rv := range ps.counterRV {
		revs[k] = rv
	}
	for _, cw := range writes {
		k, next := cw.Slot, cw.Spec
		id := lockingv1alpha1.SlotResource(w.resource, k)
		cur := w.counters[id]
		if (cur == nil && ps.counterRV[k] != "") || (cur != nil && cur.ResourceVersion != ps.counterRV[k]) {
			return // Conflict: the next pass decides again
		}
		if cur != nil && next.Fence < cur.Spec.Fence {
			panic(fmt.Sprintf("the plan lowers the fence of %s from %d to %d", id, cur.Spec.Fence, next.Fence))
		}
		if h := next.Holder; h != nil && ps.ended[types.UID(h.UID)] && (cur == nil || cur.Spec.Holder == nil || cur.Spec.Holder.UID != h.UID) {
			w.rep.PhantomGrants++
			w.rep.violate("seed %d: a counter swap at %s named %s the holder of %s, which had ended before the pass read it", w.seed, w.s.now, h.UID, id)
		}
		if cur != nil {
			w.noteSlotEnd(id, cur.Spec.Holder, next.Holder, statuses, ps.at)
			next = w.forgetLockDelay(id, cur.Spec.Holder, next)
		}
		issues := next.Holder != nil && (cur == nil || cur.Spec.Holder == nil || cur.Spec.Holder.UID != next.Holder.UID || cur.Spec.Fence != next.Fence)
		if cur == nil {
			cur = &lockingv1alpha1.FenceCounter{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: lockingv1alpha1.FenceCounterName(id)}}
			w.counters[id] = cur
		}
		cur.Spec = *next.DeepCopy()
		w.rv++
		cur.ResourceVersion = strconv.FormatInt(w.rv, 10)
		revs[k] = cur.ResourceVersion
		if issues {
			// Judged once stored: the holders the counters name now.
			w.onIssue(id, types.UID(next.Holder.UID), next.Fence)
		}
		// The counter carries the live lease, and admission judges it
		// there: the history's lease end is the latest either says.
		if h := next.Holder; h != nil {
			if end, ok, err := h.LeaseEnd(); ok && err == nil {
				w.expiresAt[types.UID(h.UID)] = max(w.expiresAt[types.UID(h.UID)], end.Sub(epochBase))
			}
		}
	}
	if w.fault[FaultControllerCrash] && len(writes) > 0 && w.rng.IntN(5) == 0 {
		w.rep.Faults[string(FaultControllerCrash)]++
		return // the restarted controller converges on the counters
	}
	for _, sg := range grantplan.SignSlots(p, issuer.Params{KeyID: "sim", Key: w.key}, func(k int32) string { return revs[k] }) {
		sg.Grant.Status.Record, sg.Grant.Status.Proof = sg.Record, sg.Proof
	}
	for _, g := range statuses {
		if !w.writeStatus(g) {
			return
		}
	}
}

// writeStatus writes g's status if the stored grant is still the version
// decided on, and tells the oracle.
func (w *semWorld) writeStatus(g *lockingv1alpha1.LockGrant) bool {
	cur := w.grants[g.UID]
	if cur == nil || cur.ResourceVersion != g.ResourceVersion {
		return false
	}
	wasHeld, wasFinal := cur.Status.Phase == lockingv1alpha1.PhaseHeld, cur.Status.Phase.Final()
	cur = w.update(cur, func(next *lockingv1alpha1.LockGrant) { next.Status = *g.Status.DeepCopy() })
	now := w.s.now
	st := &cur.Status
	if st.Phase == lockingv1alpha1.PhaseHeld {
		if !wasHeld {
			w.onHeld(cur)
		}
		w.expiresAt[cur.UID] = max(w.expiresAt[cur.UID], st.ExpiresAt.Sub(epochBase))
	}
	if !wasFinal && st.Phase.Final() {
		w.endedAt[cur.UID] = now
	}
	return true
}

// noteSlotEnd starts slot id's lock-delay when a counter write moves it
// from holder before to after (another grant or none) and the plan does not
// release before: the counter is the holder of record, so its holder ends
// at this write, as the pass decided at decided. The delay is the one its
// grant requested.
func (w *semWorld) noteSlotEnd(id string, before, after *lockingv1alpha1.FenceHolder, statuses []*lockingv1alpha1.LockGrant, decided time.Duration) {
	if before == nil || (after != nil && after.UID == before.UID) {
		return
	}
	uid := types.UID(before.UID)
	g := w.grants[uid]
	if g == nil || g.Spec.LockDelaySeconds == 0 {
		return
	}
	for _, s := range statuses {
		if s.UID == uid && s.Status.Phase == lockingv1alpha1.PhaseReleased {
			return
		}
	}
	if g.Status.Phase == lockingv1alpha1.PhaseReleased {
		return
	}
	w.rep.Faults["lock-delay-ended-unreleased"]++
	if w.namedElsewhere(id, uid) {
		w.rep.Faults["semaphore-double-grant-freed"]++
	}
	w.delayUntil[id] = max(w.delayUntil[id], decided+time.Duration(g.Spec.LockDelaySeconds)*time.Second)
}

// namedElsewhere reports whether a counter other than slot id's names grant
// uid as its holder.
func (w *semWorld) namedElsewhere(id string, uid types.UID) bool {
	for other, c := range w.counters {
		if other != id && c.Spec.Holder != nil && types.UID(c.Spec.Holder.UID) == uid {
			return true
		}
	}
	return false
}

// forgetLockDelay returns the counter spec a broken controller (w.forget)
// would store for slot id instead of next, which moves the slot from holder
// before.
func (w *semWorld) forgetLockDelay(id string, before *lockingv1alpha1.FenceHolder, next *lockingv1alpha1.FenceCounterSpec) *lockingv1alpha1.FenceCounterSpec {
	switch {
	case w.forget == forgetAll:
	case w.forget == forgetDoubled && before != nil && next.Holder == nil && w.namedElsewhere(id, types.UID(before.UID)):
	default:
		return next
	}
	next = next.DeepCopy()
	next.LockDelayUntil = ""
	if next.Holder != nil {
		next.Holder.LockDelaySeconds = 0
	}
	return next
}

// live reports whether grant uid holds by the oracle's history at t.
func (w *semWorld) live(uid types.UID, t time.Duration) bool {
	since, ok := w.heldSince[uid]
	if !ok || t < since {
		return false
	}
	if end, ok := w.endedAt[uid]; ok && t >= end {
		return false
	}
	return t < w.expiresAt[uid]
}

// onIssue judges a counter that names a new holder: fences strictly
// increase per slot, nobody is granted past an earlier waiter, no more
// grants hold than the largest limit in force while they held, and no slot
// is granted during its last holder's lock-delay.
func (w *semWorld) onIssue(id string, uid types.UID, fence int64) {
	now := w.s.now
	if fence <= w.issued[id] {
		w.rep.RegressionAccepted++
		w.rep.violate("seed %d: fence %d issued for %s after %d at %s", w.seed, fence, id, w.issued[id], now)
	}
	w.issued[id] = fence
	if w.ever[uid] {
		w.rep.Faults["semaphore-double-grant"]++
	} else {
		w.issuedAt[uid] = now
	}
	w.ever[uid] = true
	if now < w.delayUntil[id] {
		w.rep.LockDelayBroken++
		w.rep.violate("seed %d: %s granted %s at %s, before its lock-delay ends at %s", w.seed, uid, id, now, w.delayUntil[id])
	}
	for _, o := range w.grants {
		before := w.createdAt[o.UID] < w.createdAt[uid] || (w.createdAt[o.UID] == w.createdAt[uid] && o.UID < uid)
		if before && !o.Status.Phase.Final() && !w.ever[o.UID] {
			w.rep.Barged++
			w.rep.violate("seed %d: %s granted %s at %s while %s, requested before it, waits", w.seed, uid, id, now, o.UID)
		}
	}
	holders := map[types.UID]bool{uid: true}
	for _, c := range w.counters {
		if h := c.Spec.Holder; h != nil {
			if o := w.grants[types.UID(h.UID)]; o != nil && !o.Status.Phase.Final() && w.expiresAt[o.UID] > now {
				holders[o.UID] = true
			}
		}
	}
	// The limits that were in force while they held: the permits of every
	// request live at some time since the first of them was granted.
	since := now
	for h := range holders {
		if t, ok := w.issuedAt[h]; ok {
			since = min(since, t)
		}
	}
	limit := int32(0)
	for _, o := range w.grants {
		if end, ended := w.endedAt[o.UID]; !ended || end >= since {
			limit = max(limit, o.Spec.EffectivePermits())
		}
	}
	if int32(len(holders)) > limit {
		w.rep.OverLimit++
		w.rep.violate("seed %d: %d grants hold %s at %s, more than the %d permits any request live meanwhile asked for", w.seed, len(holders), w.resource, now, limit)
	}
}

// onHeld judges a grant that becomes Held: no other grant holds its slot.
func (w *semWorld) onHeld(g *lockingv1alpha1.LockGrant) {
	now := w.s.now
	id := g.HeldFencedResource()
	for uid, other := range w.slotOf {
		if uid != g.UID && other == id && w.live(uid, now) {
			w.rep.TwoHolders++
			w.rep.violate("seed %d: %s and %s both hold %s at %s", w.seed, uid, g.UID, id, now)
		}
	}
	w.slotOf[g.UID] = id
	w.heldSince[g.UID] = now
}

// acquire makes a worker ask for the current number of permits, then wait
// for its grant.
func (w *semWorld) acquire(owner string) {
	if w.s.now > w.horizon-5*time.Second {
		return
	}
	var lockDelay int32
	if w.fault[FaultLockDelay] && (w.uids+1)%2 == 0 {
		lockDelay = 1
	}
	uid := w.request(lockingv1alpha1.LockGrantSpec{Resource: w.resource, Owner: owner, LeaseDurationSeconds: 2, Permits: w.limit, LockDelaySeconds: lockDelay})
	w.s.after(50*time.Millisecond, func() { w.wait(owner, uid) })
}

// request stores a new request with spec, stamped by admission now, and
// returns its UID.
func (w *semWorld) request(spec lockingv1alpha1.LockGrantSpec) types.UID {
	w.uids++
	w.rv++
	uid := types.UID(fmt.Sprintf("uid-%d", w.uids))
	w.grants[uid] = &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: string(uid), UID: uid, ResourceVersion: strconv.FormatInt(w.rv, 10),
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: w.wall(w.s.now).Format(time.RFC3339Nano)},
		},
		Spec: spec,
	}
	w.createdAt[uid] = w.s.now
	w.uidOrder = append(w.uidOrder, uid)
	return uid
}

// wait polls the grant until it is Held (then works) or ended (then asks
// again).
func (w *semWorld) wait(owner string, uid types.UID) {
	g := w.grants[uid]
	switch {
	case g.Status.Phase == lockingv1alpha1.PhaseHeld:
		w.work(owner, uid, 1+w.rng.IntN(4))
	case g.Status.Phase.Final():
		w.s.after(time.Duration(w.rng.IntN(300))*time.Millisecond, func() { w.acquire(owner) })
	default:
		w.s.after(time.Duration(50+w.rng.IntN(150))*time.Millisecond, func() { w.wait(owner, uid) })
	}
}

// lapsed reports whether holder g's lease has run out by the status it
// was granted with: a holder here renews and releases only before that,
// as a holder that follows its own deadline does. Admission judges its
// renew and release by the grant's state alone (it has no clock); a
// renew or release that arrives late all the same is the controller's to
// end Expired, which the main world plays.
func (w *semWorld) lapsed(g *lockingv1alpha1.LockGrant) bool {
	return g.Status.ExpiresAt != nil && fencing.Expired(g.Status.ExpiresAt.Time, w.wall(w.s.now))
}

// work sends writes under the grant to its slot's store (and sometimes to
// another slot's, or late), renews, then releases or abandons the grant.
func (w *semWorld) work(owner string, uid types.UID, writes int) {
	g := w.grants[uid]
	if writes == 0 || g.Status.Phase != lockingv1alpha1.PhaseHeld {
		if g.Spec.Release || g.Status.Phase.Final() || w.rng.IntN(4) == 0 {
			// Abandoned: its lease runs out.
		} else {
			w.release(owner, g)
		}
		w.s.after(time.Duration(w.rng.IntN(500))*time.Millisecond, func() { w.acquire(owner) })
		return
	}
	target := g.HeldFencedResource()
	if w.rng.IntN(6) == 0 {
		target = lockingv1alpha1.SlotResource(w.resource, (g.HeldSlot()+1+w.rng.Int32N(3))%4)
		w.rep.Faults["semaphore-misrouted-write"]++
	}
	fence, delay := g.Status.FenceToken, time.Duration(w.rng.IntN(300))*time.Millisecond
	if w.fault[FaultPause] && w.rng.IntN(4) == 0 {
		delay += 3 * time.Second // arrives after the lease
		w.rep.Faults[string(FaultPause)]++
	}
	w.s.after(delay, func() { w.write(owner, uid, target, fence) })
	if w.rng.IntN(3) == 0 {
		if err := fencing.CheckRenewRequest(*facts.Grant(g), owner); err == nil && !w.lapsed(g) {
			w.update(g, func(next *lockingv1alpha1.LockGrant) { next.Spec.Renewals++ })
		}
	}
	w.s.after(time.Duration(100+w.rng.IntN(500))*time.Millisecond, func() { w.work(owner, uid, writes-1) })
}

// release asks for g's release as its owner's client does: only before
// its lease end by its own clock (lapsed), and admitted when fencing allows
// the caller to (fencing.CheckReleaseRequest). It reports whether it did.
func (w *semWorld) release(owner string, g *lockingv1alpha1.LockGrant) bool {
	g = w.grants[g.UID] // as stored now
	if g.Status.Phase == lockingv1alpha1.PhaseHeld && w.lapsed(g) {
		return false // its lease ran out by its own clock: it does not release
	}
	if err := fencing.CheckReleaseRequest(*facts.Grant(g), owner); err != nil {
		return false
	}
	w.update(g, func(next *lockingv1alpha1.LockGrant) { next.Spec.Release = true })
	return true
}

// update stores a new version of stored grant g, changed by change, with a
// new resourceVersion, and returns it. g itself is left as it was: whoever
// read it keeps what they read.
func (w *semWorld) update(g *lockingv1alpha1.LockGrant, change func(next *lockingv1alpha1.LockGrant)) *lockingv1alpha1.LockGrant {
	next := *g
	change(&next)
	w.rv++
	next.ResourceVersion = strconv.FormatInt(w.rv, 10)
	w.grants[next.UID] = &next
	return &next
}

// write offers a write under a grant's fence to the store of fenced
// resource id, as an enforcement point judges it (fencing.CheckWrite, the
// grant and the slot's counter read linearizably), and judges what was
// accepted against the history.
func (w *semWorld) write(owner string, uid types.UID, id string, fence int64) {
	now := w.s.now
	w.rep.Offered++
	// As admission reads them (facts.ReadRegistry): the counter, and the
	// grant only when the counter does not record it as its holder.
	g, c := facts.Registry(string(uid), w.grants[uid], w.counters[id])
	err := fencing.CheckWrite(fencing.Write{Resource: id, Caller: owner, Fence: fence, Recorded: w.stores[id],
		Grant: g, Counter: c, Now: w.wall(now)})
	if err != nil {
		w.rep.Rejected[string(fencing.ReasonOf(err))]++
		return
	}
	w.rep.Accepted++
	w.rep.AcceptedChecked++
	switch {
	case w.slotOf[uid] != id:
		w.rep.StaleAccepted++
		w.rep.violate("seed %d: %s accepted a write of %s, which holds %s, at %s", w.seed, id, uid, w.slotOf[uid], now)
	case fence < w.issued[id]:
		w.rep.StaleAccepted++
		w.rep.violate("seed %d: %s accepted fence %d after fence %d was issued, at %s", w.seed, id, fence, w.issued[id], now)
	case !w.live(uid, now):
		w.rep.ExpiredOwnerAccepted++
		w.rep.violate("seed %d: %s accepted a write of %s after its grant ended, at %s", w.seed, id, uid, now)
	case fence < w.stores[id] || (fence == w.stores[id] && w.storeGrant[id] != uid):
		w.rep.RegressionAccepted++
		w.rep.violate("seed %d: %s accepted fence %d after fence %d, at %s", w.seed, id, fence, w.stores[id], now)
	}
	w.stores[id], w.storeGrant[id] = fence, uid
}
