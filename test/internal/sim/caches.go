package sim

import (
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
)

// replicaCache is one replica's informers and the writes it made that they
// have not delivered yet, as the controller keeps them
// (controllers/lockgrant: ownwrites.go, statuses.go):
//
//   - grants and counters are what its watches delivered, each change a
//     moment after it was stored (watchLag), in the order stored, none
//     while the replica is frozen, and those it missed within catchUp after
//     a thaw; a delivered change that the controller's predicates pass
//     (a counter's spec that is not this replica's own write, a grant
//     created, deleted or changed in spec or annotations) starts a pass;
//   - ownCounters are its compare-and-swaps until delivered, and
//     ownStatuses its planned and written statuses until delivered: a pass
//     decides on them in place of the older copies its caches show;
//   - writers hold each resource's statuses the replica decided and has
//     not written yet, written one at a time after the pass, a later plan
//     for a grant replacing an earlier one not yet sent.
type replicaCache struct {
	grants   map[types.UID]*lockingv1alpha1.LockGrant
	counters map[string]*lockingv1alpha1.FenceCounter
	inbox    []delivery
	pumping  bool
	// catchUp is how long after a thaw the watches have delivered what
	// they missed.
	catchUp time.Duration

	// seenGrants is the highest resourceVersion of a grant change the
	// grants' watch delivered (controllers/lockgrant: seenMark); 0 before
	// the first.
	seenGrants int64

	ownCounters map[string]*lockingv1alpha1.FenceCounter
	ownStatuses map[types.UID]*ownStatus
	writers     map[string][]*statusItem
	writing     map[string]bool
	// drops counts, per resource, the times the writer dropped its queue
	// after a refused write: a pass that began before a drop and enqueues
	// after it may have decided on a dropped status, and is decided again
	// (controllers/lockgrant: errStatusesDropped).
	drops map[string]int
}

// ownStatus is a status the replica planned: written is the grant's
// resourceVersion its write returned, "" until then.
type ownStatus struct {
	status  lockingv1alpha1.LockGrantStatus
	written string
}

// statusItem is one planned status waiting for the replica's writer.
type statusItem struct {
	grant *lockingv1alpha1.LockGrant
}

// delivery is one stored change on its way to a replica's cache: a grant
// (nil once deleted) or a counter.
type delivery struct {
	at       time.Duration
	uid      types.UID
	grant    *lockingv1alpha1.LockGrant
	resource string
	counter  *lockingv1alpha1.FenceCounter
}

// watchLag is how long after it is stored a change reaches a replica.
func (rp *replica) watchLag() time.Duration { return rp.between(time.Millisecond, 10*time.Millisecond) }

// newReplicaCache starts a replica's caches synced with the registry.
func newReplicaCache(r *registry) *replicaCache {
	c := &replicaCache{grants: map[types.UID]*lockingv1alpha1.LockGrant{}, counters: map[string]*lockingv1alpha1.FenceCounter{},
		ownCounters: map[string]*lockingv1alpha1.FenceCounter{}, ownStatuses: map[types.UID]*ownStatus{},
		writers: map[string][]*statusItem{}, writing: map[string]bool{}, drops: map[string]int{}}
	c.relist(r)
	return c
}

// relist sets the caches to what is stored, as a restarted replica's
// informers list it.
func (c *replicaCache) relist(r *registry) {
	clear(c.grants)
	clear(c.counters)
	for uid, g := range r.grants {
		c.grants[uid] = g.DeepCopy()
		c.seeGrant(g)
	}
	for res, ct := range r.counters {
		c.counters[res] = ct.DeepCopy()
	}
	c.inbox = nil
}

// publishGrant sends the grant's stored version to every replica's watch.
func (w *world) publishGrant(uid types.UID) {
	var g *lockingv1alpha1.LockGrant
	if cur := w.reg.grants[uid]; cur != nil {
		g = cur.DeepCopy()
	}
	for _, rp := range w.replicas {
		w.toReplica(rp, delivery{uid: uid, grant: g})
	}
}

// publishCounter sends the counter's stored version to every replica's
// watch.
func (w *world) publishCounter(resource string) {
	c := w.reg.counters[resource].DeepCopy()
	for _, rp := range w.replicas {
		w.toReplica(rp, delivery{resource: resource, counter: c})
	}
}

// toReplica queues d for rp's cache after its watch lag, behind what is
// already on its way.
func (w *world) toReplica(rp *replica, d delivery) {
	d.at = w.s.now + rp.watchLag()
	if n := len(rp.cache.inbox); n > 0 {
		d.at = max(d.at, rp.cache.inbox[n-1].at)
	}
	rp.cache.inbox = append(rp.cache.inbox, d)
	w.pump(rp)
}

// pump applies rp's deliveries that are due, unless it is frozen, and
// schedules itself for the next.
func (w *world) pump(rp *replica) {
	c := rp.cache
	if c.pumping || len(c.inbox) == 0 {
		return
	}
	at := c.inbox[0].at
	if w.s.now < rp.frozenUntil {
		at = max(at, rp.frozenUntil+c.catchUp)
	}
	c.pumping = true
	w.s.at(at, func() {
		c.pumping = false
		for len(c.inbox) > 0 && c.inbox[0].at <= w.s.now && w.s.now >= rp.frozenUntil {
			d := c.inbox[0]
			c.inbox = c.inbox[1:]
			w.apply(rp, d)
		}
		w.pump(rp)
	})
}

// apply puts one delivered change into rp's caches, forgets the own write
// it shows, and starts a pass when the controller's predicates would.
func (w *world) apply(rp *replica, d delivery) {
	c := rp.cache
	if d.counter != nil {
		old := c.counters[d.resource]
		c.counters[d.resource] = d.counter
		own := false
		if o := c.ownCounters[d.resource]; o != nil {
			switch o.ResourceVersion {
			case d.counter.ResourceVersion:
				own = true
				delete(c.ownCounters, d.resource)
				w.rep.Faults["replica-own-counter-event"]++
			case rvOf(old):
				delete(c.ownCounters, d.resource) // moved past it
			}
		}
		if !own && (old == nil || old.Generation != d.counter.Generation) {
			w.scheduleReplica(rp, d.resource, rp.between(0, time.Millisecond))
		}
		return
	}
	old := c.grants[d.uid]
	if d.grant == nil {
		delete(c.grants, d.uid)
		delete(c.ownStatuses, d.uid)
	} else {
		c.grants[d.uid] = d.grant
		c.seeGrant(d.grant)
		if o := c.ownStatuses[d.uid]; o != nil && o.written != "" && (o.written == d.grant.ResourceVersion || o.written == rvOf(old)) {
			delete(c.ownStatuses, d.uid)
		}
	}
	g := d.grant
	if g == nil {
		g = old
	}
	if g == nil {
		return
	}
	if old == nil || d.grant == nil || !equality.Semantic.DeepEqual(old.Spec, d.grant.Spec) || !equality.Semantic.DeepEqual(old.Annotations, d.grant.Annotations) {
		w.scheduleReplica(rp, g.Spec.Resource, rp.between(0, time.Millisecond))
	}
}

// seeGrant raises the cache's mark to g's resourceVersion, as the
// controller's grant event handlers do.
func (c *replicaCache) seeGrant(g *lockingv1alpha1.LockGrant) {
	if rv, err := strconv.ParseInt(g.ResourceVersion, 10, 64); err == nil && rv > c.seenGrants {
		c.seenGrants = rv
	}
}

// seen is the cache's mark as the controller keeps it: "" before the
// first grant change.
func (c *replicaCache) seen() string {
	if c.seenGrants == 0 {
		return ""
	}
	return strconv.FormatInt(c.seenGrants, 10)
}

func rvOf[T interface{ GetResourceVersion() string }](o T) string {
	var zero T
	if any(o) == any(zero) {
		return ""
	}
	return o.GetResourceVersion()
}

// cachedGrants are resource's grants as rp's cache shows them, with its
// own statuses in place while the cache shows none of them yet.
func (rp *replica) cachedGrants(resource string) map[types.UID]*lockingv1alpha1.LockGrant {
	c := rp.cache
	out := map[types.UID]*lockingv1alpha1.LockGrant{}
	for uid, g := range c.grants {
		if g.Spec.Resource != resource {
			continue
		}
		if o := c.ownStatuses[uid]; o != nil && (o.written == "" || o.written != g.ResourceVersion) {
			g = g.DeepCopy()
			g.Status = *o.status.DeepCopy()
		}
		out[uid] = g
	}
	return out
}

// cachedCounter is resource's counter as rp decides on it from its cache:
// its own write while the cache does not show it yet.
func (rp *replica) cachedCounter(resource string) *lockingv1alpha1.FenceCounter {
	if o := rp.cache.ownCounters[resource]; o != nil {
		return o
	}
	return rp.cache.counters[resource]
}

// overlay is g, read directly, with rp's status in place while it is not
// written yet.
func (rp *replica) overlay(g *lockingv1alpha1.LockGrant) *lockingv1alpha1.LockGrant {
	if g == nil {
		return nil
	}
	if o := rp.cache.ownStatuses[g.UID]; o != nil && o.written == "" {
		g = g.DeepCopy()
		g.Status = *o.status.DeepCopy()
	}
	return g
}

// enqueueStatuses hands a pass's statuses to rp's writer, in the plan's
// order; each becomes rp's own until its cache shows it.
func (w *world) enqueueStatuses(rp *replica, resource string, statuses []*lockingv1alpha1.LockGrant) {
	c := rp.cache
	for _, g := range statuses {
		c.ownStatuses[g.UID] = &ownStatus{status: *g.Status.DeepCopy()}
		q := c.writers[resource]
		if i := slices.IndexFunc(q, func(it *statusItem) bool { return it.grant.UID == g.UID }); i >= 0 {
			// Replaced by the later plan, in that plan's order.
			q = slices.Delete(q, i, i+1)
			w.rep.Faults["replica-status-coalesced"]++
		}
		c.writers[resource] = append(q, &statusItem{grant: g})
	}
	w.writeNextStatus(rp, resource)
}

// writeNextStatus writes the next of resource's statuses one network hop
// later (a frozen replica sends nothing until it thaws). The API server
// refuses a status its transition rules forbid; the writer then drops the
// resource's remaining statuses and asks for a pass, as one whose write was
// refused.
func (w *world) writeNextStatus(rp *replica, resource string) {
	c := rp.cache
	if c.writing[resource] || len(c.writers[resource]) == 0 {
		return
	}
	c.writing[resource] = true
	var send func()
	send = func() {
		if w.s.now < rp.frozenUntil {
			w.s.at(rp.frozenUntil, send)
			return
		}
		c.writing[resource] = false
		q := c.writers[resource]
		if len(q) == 0 {
			return
		}
		it := q[0]
		c.writers[resource] = q[1:]
		cur := w.reg.grants[it.grant.UID]
		switch {
		case cur == nil:
			delete(c.ownStatuses, it.grant.UID)
		case !statusAllowed(&cur.Status, &it.grant.Status):
			w.rep.Faults["replica-status-refused"]++
			for _, rest := range append([]*statusItem{it}, c.writers[resource]...) {
				delete(c.ownStatuses, rest.grant.UID)
			}
			c.writers[resource] = nil
			c.drops[resource]++
			w.s.after(50*time.Millisecond, func() { w.scheduleReplica(rp, resource, 0) })
			return
		default:
			w.reg.setStatus(cur, it.grant)
			if o := c.ownStatuses[it.grant.UID]; o != nil {
				o.written = cur.ResourceVersion
			}
			w.afterStatus(resource)
		}
		w.writeNextStatus(rp, resource)
	}
	w.s.after(rp.between(time.Millisecond, maxReplicaHop), send)
}

// statusAllowed is the API server's judgment of a status write by the
// LockGrant status's transition rules (api/v1alpha1: LockGrantStatus): a
// final phase, an issued fence and a published record never change, and
// counterGeneration never decreases while the fence stays (unset on either
// side: a controller of an earlier version).
func statusAllowed(old, next *lockingv1alpha1.LockGrantStatus) bool {
	switch {
	case old.Phase.Final() && next.Phase != old.Phase:
		return false
	case old.FenceToken != 0 && next.FenceToken != old.FenceToken:
		return false
	case old.Proof != "" && next.Proof != old.Proof:
		return false
	case next.CounterGeneration != 0 && old.CounterGeneration != 0 && (next.FenceToken == 0) == (old.FenceToken == 0) &&
		next.CounterGeneration < old.CounterGeneration:
		return false
	}
	return true
}

// validated is the controller's rule (controllers/lockgrant: validated):
// a plan's compare-and-swaps validate every counter it was decided on, or
// it writes no status. An exclusive lock has one counter.
func validated(f grantplan.Facts, p grantplan.Plan) bool {
	if len(p.Statuses) == 0 {
		return true
	}
	return p.Counter != nil
}

// stampGrant gives g a new resourceVersion, as every stored change does.
func (r *registry) stampGrant(g *lockingv1alpha1.LockGrant) {
	r.rv++
	g.ResourceVersion = strconv.FormatInt(r.rv, 10)
	if r.onGrant != nil {
		r.onGrant(g.UID)
	}
}
