package sim

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/issuer"
)

// MaxReplicaSkew is the clock-skew bound between manager replicas that the
// simulation plays: each round's two deciders have clocks up to this far
// ahead of or behind the registry's, the bound docs/ha.md states.
const MaxReplicaSkew = 250 * time.Millisecond

// replica is one manager replica running the LockGrant controller: every
// replica reconciles every resource, with nothing but conditional writes
// between them, as the manager does with --grants-on-every-replica.
type replica struct {
	// skew is how far this replica's clock is ahead of the registry's
	// (negative: behind).
	skew time.Duration
	// pending marks a pass already scheduled per resource.
	pending map[string]bool
	// rng draws the replica's own delays, apart from the world's stream, so
	// that the replicas leave the rest of a round's schedule as it was.
	rng *rand.Rand
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
// bound, one of them possibly ahead and the other behind.
func (w *world) newReplicas() []*replica {
	rs := make([]*replica, 2)
	for i := range rs {
		rp := &replica{pending: map[string]bool{}, rng: rand.New(rand.NewPCG(w.seed, 0x5e11ca+uint64(i)))}
		rp.skew = rp.between(-MaxReplicaSkew, MaxReplicaSkew)
		rs[i] = rp
	}
	return rs
}

// pass is what one replica gathered and decided, to be applied later:
// between the two, the other replica may write.
type pass struct {
	resource  string
	counterRV string
	read      map[types.UID]*lockingv1alpha1.LockGrant
	plan      grantplan.Plan
	params    issuer.Params
}

// gather reads a resource's grants and counter and decides on them at the
// replica's clock, now+skew. The replica observed each session Lease by its
// own clock too, so their observation times carry the same skew.
func (r *registry) gather(resource string, now, skew time.Duration) pass {
	ps := pass{resource: resource, read: map[types.UID]*lockingv1alpha1.LockGrant{}}
	var grants []lockingv1alpha1.LockGrant
	for _, g := range r.grants {
		if g.Spec.Resource == resource {
			grants = append(grants, *g.DeepCopy())
			ps.read[g.UID] = g.DeepCopy()
		}
	}
	slices.SortFunc(grants, func(a, b lockingv1alpha1.LockGrant) int { return compareUID(a.UID, b.UID) })
	var counter *lockingv1alpha1.FenceCounter
	if c := r.counters[resource]; c != nil {
		counter = c.DeepCopy()
		ps.counterRV = c.ResourceVersion
	}
	ps.params = issuer.Params{Epoch: r.epoch, Revoked: slices.Clone(r.revoked), KeyID: r.keyID, Key: r.key}
	sessions := r.sessionFacts(now)
	for _, ss := range sessions {
		ss.ObservedAt = ss.ObservedAt.Add(skew)
	}
	ps.plan = grantplan.Decide(grantplan.Facts{
		Now: r.wall(now + skew), Resource: resource, Counter: counter, Grants: grants,
		Epoch: r.epoch, Revoked: ps.params.Revoked, Params: ps.params, Sessions: sessions,
	})
	return ps
}

// unchanged is the resourceVersion precondition of a grant's status write:
// the grant is as the pass read it.
func (r *registry) unchanged(ps pass, uid types.UID) (*lockingv1alpha1.LockGrant, bool) {
	cur, was := r.grants[uid], ps.read[uid]
	if cur == nil || was == nil {
		return cur, false
	}
	return cur, equality.Semantic.DeepEqual(cur.Spec, was.Spec) && equality.Semantic.DeepEqual(cur.Status, was.Status) &&
		equality.Semantic.DeepEqual(cur.Annotations, was.Annotations)
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

// apply writes a pass's plan as the LockGrant controller does: the
// holder's end first (conditional on the holder as read), then the
// counter by compare-and-swap, then the other statuses, each conditional.
// A failed precondition ends the pass, as a Conflict does; it reports
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
	statuses := p.Statuses
	if p.Counter != nil && c != nil && c.Spec.Holder != nil {
		for i, g := range statuses {
			if string(g.UID) == c.Spec.Holder.UID && g.Status.Phase.Final() {
				if !r.writeStatus(ps, g) {
					return 0, true
				}
				statuses = append(statuses[:i:i], statuses[i+1:]...)
				break
			}
		}
	}
	revision := ps.counterRV
	if p.Counter != nil {
		if c == nil {
			c = &lockingv1alpha1.FenceCounter{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: lockingv1alpha1.FenceCounterName(ps.resource)}}
			r.counters[ps.resource] = c
		}
		if p.Counter.Fence < c.Spec.Fence {
			panic("the plan lowers the fence of " + ps.resource)
		}
		r.rv++
		c.Spec = *p.Counter.DeepCopy()
		c.ResourceVersion = strconv.FormatInt(r.rv, 10)
		revision = c.ResourceVersion
	}
	if r.crashNext {
		r.crashNext = false
		return time.Millisecond, false
	}
	p.Statuses = statuses
	grantplan.Sign(p, ps.params, revision)
	for _, g := range statuses {
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
		if rp.pending[resource] {
			continue
		}
		rp.pending[resource] = true
		w.s.after(rp.between(time.Millisecond, 15*time.Millisecond), func() { w.replicaPass(rp, resource) })
	}
}

// replicaPass gathers and decides at the replica's clock, then applies the
// plan after a network hop, during which the other replica may act.
func (w *world) replicaPass(rp *replica, resource string) {
	rp.pending[resource] = false
	if w.fault[FaultControllerCrash] && rp.rng.Float64() < 0.05 {
		w.reg.crashNext = true
		w.rep.Faults[string(FaultControllerCrash)]++
	}
	ps := w.reg.gather(resource, w.s.now, rp.skew)
	w.s.after(rp.between(time.Millisecond, 40*time.Millisecond), func() {
		requeue, conflict := w.reg.apply(ps)
		if conflict {
			w.rep.Faults["replica-conflict"]++
			requeue = time.Millisecond
		}
		w.afterPass(resource, requeue)
	})
}
