package grantplan

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Facts is what one decision about a resource needs.
type Facts struct {
	// Now is the controller's clock.
	Now time.Time
	// Retention is how long a finished grant is kept; 0 keeps it forever.
	Retention time.Duration
	// Resource is the resource ID.
	Resource string
	// Counter is the resource's FenceCounter from a direct read; nil when
	// it does not exist yet. It is slot 0's counter: the only one of an
	// exclusive lock.
	Counter *lockingv1alpha1.FenceCounter
	// SlotCounters are the FenceCounters of slots 1 and above of a
	// resource with permits (LockGrantSpec.Permits), by slot, read like
	// Counter; a slot whose counter does not exist yet has no entry. The
	// controller reads every slot below the largest permits a live grant
	// names, and every slot a live grant's status names.
	SlotCounters map[int32]*lockingv1alpha1.FenceCounter
	// Grants are every LockGrant of the resource in the namespace.
	Grants []lockingv1alpha1.LockGrant
	// Epoch is the current issuer epoch, revoked the revoked epochs.
	Epoch   int64
	Revoked []int64
	// Policies are the GuardPolicies the grants name; a nil value means
	// the policy does not exist.
	Policies map[string]*lockingv1alpha1.GuardPolicy
	// Sessions are the session Leases that live grants name, by Lease
	// name; a nil value means the Lease does not exist.
	Sessions map[string]*fencing.Session
	// Floors are the highest fences guarded objects were found to have
	// recorded for the resource and its slots (internal/recovery), by
	// fenced resource ID (lockingv1alpha1.SlotResource): no fence at or
	// below one is issued (fencing.NextFenceAbove). nil: none known.
	Floors map[string]Floor
}

// Floor is a fence a guarded object recorded for a resource: Fence, and
// Where, the object that recorded it ("ConfigMap billing/ledger-7"), for
// the message that holds a request back.
type Floor struct {
	Fence int64
	Where string
}

// nextFence is the fence slot k's next holder gets above highest, or why
// none (fencing.NextFenceAbove over the slot's floor); a refusal for the
// floor names the object that recorded it.
func (f Facts) nextFence(k int32, highest int64) (int64, error) {
	fl := f.Floors[lockingv1alpha1.SlotResource(f.Resource, k)]
	next, err := fencing.NextFenceAbove(highest, fl.Fence, f.Epoch)
	var e *fencing.Error
	if fl.Where != "" && errors.As(err, &e) && e.Reason == fencing.ReasonFenceRegression {
		return 0, &fencing.Error{Reason: e.Reason, Detail: e.Detail + " (recorded on " + fl.Where + ")"}
	}
	return next, err
}

// session says whether g's session keeps it alive: it returns the instant
// the session lapses unless renewed (zero for a grant without a session),
// or the refusal (SESSION_EXPIRED) once the session is gone or lapsed.
func (f Facts) session(g *lockingv1alpha1.LockGrant) (time.Time, error) {
	ref := g.Spec.Session
	if ref == nil {
		return time.Time{}, nil
	}
	s := f.Sessions[ref.Name]
	if err := fencing.CheckSession(s, ref.UID, g.Spec.Owner, f.Now); err != nil {
		return time.Time{}, err
	}
	return s.LapsesAt(), nil
}

// renewing says whether g's session is still being renewed on its
// cadence (fencing.CheckSessionRenewing), for the grant to the head of the
// queue, which cannot wait for it to lapse: it returns when the next
// renewal is due (zero for a grant without a session), or the refusal once
// it is overdue.
func (f Facts) renewing(g *lockingv1alpha1.LockGrant) (time.Time, error) {
	ref := g.Spec.Session
	if ref == nil {
		return time.Time{}, nil
	}
	s := f.Sessions[ref.Name]
	if err := fencing.CheckSessionRenewing(s, f.Now); err != nil {
		return time.Time{}, err
	}
	return s.RenewalDueAt(), nil
}

// revocation says why a grant that is Held or waiting must be revoked, or
// "" when it may go on: its epoch was revoked or superseded, or its policy
// no longer allows it.
func (f Facts) revocation(g *lockingv1alpha1.LockGrant) (reason, msg string) {
	if fence := g.Status.FenceToken; fence > 0 {
		if err := fencing.CheckFenceEpoch(fence, f.Epoch, f.Revoked); err != nil {
			return lockingv1alpha1.LockGrantReasonRevokedEpoch, detail(err)
		}
		// A fence of a later epoch than the issuer's, or of sequence 0,
		// was never issued in its epoch: an earlier version carried a
		// full sequence into the epoch bits. Revoking the epoch it was
		// issued in would miss it, so it ends now.
		if fencing.EpochOf(fence) > f.Epoch || fencing.CheckIssued(fence, nil) != nil {
			return lockingv1alpha1.LockGrantReasonRevokedEpoch, fmt.Sprintf("fence %s names issuer epoch %d but was never issued in it (the issuer is at epoch %d)",
				fencing.FormatFence(fence), fencing.EpochOf(fence), f.Epoch)
		}
	}
	if name := g.Spec.Policy; name != "" {
		pol := f.Policies[name]
		if pol == nil {
			return lockingv1alpha1.LockGrantReasonPolicyDenied, fmt.Sprintf("GuardPolicy %q does not exist", name)
		}
		if why := policy.AllowsGrant(pol, g.Spec.Owner, policy.Groups(g), g.Spec.LeaseDurationSeconds); why != "" {
			return lockingv1alpha1.LockGrantReasonPolicyDenied, why
		}
	}
	return "", ""
}

// Event is one Kubernetes Event to emit about a grant.
type Event struct {
	Grant   *lockingv1alpha1.LockGrant
	Warning bool
	Reason  string
	Note    string
	// Issuer says the Event is sent regarding the FenceIssuer too: the
	// operator must act there (raise the epoch) for the grant to go on.
	Issuer bool
}

// Plan is the outcome of Decide: what to write, in order.
type Plan struct {
	// Counter is slot 0's counter's new spec, or nil when it does not
	// change.
	Counter *lockingv1alpha1.FenceCounterSpec
	// SlotCounters are the new specs of the counters of slots 1 and
	// above that change, by slot.
	SlotCounters map[int32]*lockingv1alpha1.FenceCounterSpec
	// Granted are the grants that become Held in this pass, in FIFO
	// order; their statuses are written first.
	Granted []*lockingv1alpha1.LockGrant
	// Statuses are the grants whose status changes, with the new status set.
	Statuses []*lockingv1alpha1.LockGrant
	// Deletes are finished grants past their retention.
	Deletes []*lockingv1alpha1.LockGrant
	// Events are the Events to emit.
	Events []Event
	// PolicyGenerations are the generations of the policies grants name,
	// bound into their records.
	PolicyGenerations map[string]int64
	// RequeueAfter is the time to the next deadline (an expiry or a wait
	// limit); 0 when there is none.
	RequeueAfter time.Duration
}

// Empty reports whether p writes nothing: no counter, no status (so no
// grant and no Event either) and no deletion. Its RequeueAfter may still
// ask for a later pass.
func (p Plan) Empty() bool {
	return p.Counter == nil && len(p.SlotCounters) == 0 && len(p.Statuses) == 0 && len(p.Deletes) == 0
}

// FIFO orders requests as the controller serves them: by admission time
// (creation time when the stamp is missing), then UID. Clients compute a
// waiter's live queue position with it.
func FIFO(a, b lockingv1alpha1.LockGrant) int { return fifo(a, b) }

// fifo orders requests by admission time, then creation time, then UID.
func fifo(a, b lockingv1alpha1.LockGrant) int {
	if c := requestedAt(&a).Compare(requestedAt(&b)); c != 0 {
		return c
	}
	return cmp.Compare(a.UID, b.UID)
}

// requestedAt is when admission stamped the request, falling back to the
// creation time when the stamp is missing or unreadable.
func requestedAt(g *lockingv1alpha1.LockGrant) time.Time {
	if s, ok := g.Annotations[lockingv1alpha1.RequestedAtAnnotation]; ok {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t
		}
	}
	return g.CreationTimestamp.Time
}

func ttl(g *lockingv1alpha1.LockGrant) time.Duration {
	return time.Duration(g.Spec.LeaseDurationSeconds) * time.Second
}

// waitDeadline is when a Pending request stops waiting; zero without limit.
func waitDeadline(g *lockingv1alpha1.LockGrant) time.Time {
	if g.Spec.WaitTimeoutSeconds <= 0 {
		return time.Time{}
	}
	return requestedAt(g).Add(time.Duration(g.Spec.WaitTimeoutSeconds) * time.Second)
}

// slot is what a pass knows and decides about one slot of the resource.
type slot struct {
	counter *lockingv1alpha1.FenceCounter
	holder  *lockingv1alpha1.FenceHolder
	fence   int64
	// live: the holder's grant goes on holding after this pass.
	live bool
	// released: the grant the counter names is listed and ends released
	// by its owner (in this pass or before), so the slot is freed without
	// lock-delay. Any other end frees it with the holder's lock-delay.
	released bool
	// next is the counter's new spec, if it changes.
	next *lockingv1alpha1.FenceCounterSpec
	// delayUntil is the end of the slot's lock-delay, zero without one.
	delayUntil time.Time
	// noFence is why the issuer's epoch has no fence for the slot above
	// its counter's (fencing.NextFence); nil when it has one.
	noFence error
}

// Decide computes, from the facts alone, every change for one resource: who
// holds it (FIFO by admission time), the next fence (fencing.NextFence over
// the counter, in the current issuer epoch), which grants end (released,
// expired at expiresAt, timed out, revoked), renewals, queue positions, and
// the next deadline to requeue at. It does no I/O.
//
// A resource with permits is a set of slots, each decided by the rules of
// an exclusive lock on its own counter; the slots share one FIFO queue,
// whose head is granted the lowest free slot below the limit (Limit) while
// fewer grants hold than the limit allows. Nobody behind the head is
// granted before it.
//
// Decide is the list of its phases, in the order they run; each is a
// method of pass and reads what the earlier ones left there.
func Decide(f Facts) Plan {
	p := newPass(f)
	p.readCounters()
	p.settle()
	p.lockDelay()
	p.fences()
	p.admit()
	p.freeSlots()
	p.counters()
	p.limits()
	p.positions()
	p.statusOrder()
	p.requeue()
	return p.plan
}

// pass is one decision in the making: the facts it decides on, what its
// phases learned about the resource's slots and grants so far, and the
// plan they build.
type pass struct {
	f   Facts
	now metav1.MicroTime
	// plan is the outcome under construction.
	plan Plan
	// grants are the facts' grants in FIFO order.
	grants []lockingv1alpha1.LockGrant
	// slots are the resource's slots by number.
	slots map[int32]*slot
	// named are the slots whose counter names each grant, lowest first,
	// by UID.
	named map[string][]int32
	// holding are the holders that go on holding, waiting the requests
	// that go on waiting, in FIFO order.
	holding, waiting []*lockingv1alpha1.LockGrant
	// endedHolders are the grants whose hold ends in this pass (or ended
	// in an earlier one whose status write was lost): their statuses are
	// written first, once the counters have moved on.
	endedHolders []types.UID
	// deadlines are the instants a later pass must decide at (zero: none).
	deadlines []time.Time
	// limit is the number of permits in force (Limit).
	limit int32
	// headDelay is the end of the lock-delay that holds the head of the
	// queue back (zero: none); headNoFence is why the issuer's epoch has
	// no fence for it (nil: it has one).
	headDelay   time.Time
	headNoFence error
}

// newPass starts a pass over f: the policies' generations, which records
// bind, and the grants in FIFO order.
func newPass(f Facts) *pass {
	p := &pass{f: f, now: metav1.NewMicroTime(f.Now), plan: Plan{PolicyGenerations: map[string]int64{}}}
	for name, pol := range f.Policies {
		if pol != nil {
			p.plan.PolicyGenerations[name] = pol.Generation
		}
	}
	p.grants = slices.Clone(f.Grants)
	slices.SortFunc(p.grants, fifo)
	return p
}

// emit adds Events to the plan.
func (p *pass) emit(evs ...Event) {
	p.plan.Events = append(p.plan.Events, evs...)
}

// write adds g to the statuses the plan writes, once.
func (p *pass) write(g *lockingv1alpha1.LockGrant) {
	if !slices.Contains(p.plan.Statuses, g) {
		p.plan.Statuses = append(p.plan.Statuses, g)
	}
}

// readCounters decides which slots the resource has and who holds them,
// as their counters say: slot 0 always (the resource's own counter), and
// each slot of a resource with permits whose counter exists.
func (p *pass) readCounters() {
	p.slots = map[int32]*slot{0: {counter: p.f.Counter}}
	for k, c := range p.f.SlotCounters {
		if k > 0 && k < lockingv1alpha1.MaxPermits {
			p.slots[k] = &slot{counter: c}
		}
	}
	p.named = map[string][]int32{}
	for _, k := range slotNumbers(p.slots) {
		sl := p.slots[k]
		if sl.counter == nil {
			continue
		}
		sl.holder, sl.fence = sl.counter.Spec.Holder, sl.counter.Spec.Fence
		if sl.holder != nil {
			p.named[sl.holder.UID] = append(p.named[sl.holder.UID], k)
		}
	}
}

// settle decides each grant on its own, in FIFO order: whether a final
// grant is deleted, whether a holder goes on holding (renewed) or ends,
// whether a grant Held in its status that no counter names ends, and
// whether a request goes on waiting or ends. It notes the slots their
// holders leave released by their owner, and a reported fence regression.
func (p *pass) settle() {
	for i := range p.grants {
		named := p.named[string(p.grants[i].UID)]
		own, isHolder := ownSlot(&p.grants[i], named, p.slots)
		if quiet(&p.grants[i], p.f) {
			noteRelease(p.slots, named, &p.grants[i])
			continue // a finished grant with nothing left to do: no copy
		}
		g := p.grants[i].DeepCopy()
		old := g.Status.DeepCopy()
		switch {
		case g.Status.Phase.Final():
			p.retain(g)
		case isHolder:
			p.settleHolder(g, own)
		case g.Status.Phase == lockingv1alpha1.PhaseHeld:
			// Held in status but no longer the counter's holder: the
			// counter moved on (this controller wrote the counter and died
			// before ending this grant). It can never hold again.
			_, serr := p.f.session(g)
			p.emit(endHeldNotHolder(g, serr, p.now))
			p.endedHolders = append(p.endedHolders, g.UID)
		default: // Pending, or new.
			p.settleRequest(g)
		}
		p.noteRegression(g)
		if !equalStatus(old, &g.Status) {
			p.plan.Statuses = append(p.plan.Statuses, g)
		}
		noteRelease(p.slots, p.named[string(g.UID)], g)
	}
}

// retain decides whether a final grant is deleted: once its retention has
// passed. Nothing else ever changes a final grant.
func (p *pass) retain(g *lockingv1alpha1.LockGrant) {
	st := &g.Status
	if p.f.Retention > 0 && st.EndedAt != nil {
		gone := st.EndedAt.Add(p.f.Retention)
		if fencing.Expired(gone, p.f.Now) {
			p.plan.Deletes = append(p.plan.Deletes, g)
		} else {
			p.deadlines = append(p.deadlines, gone)
		}
	}
}

// settleHolder decides the grant slot own's counter names: it is revoked
// (its epoch or its policy), ends with its session, is released, expires,
// or goes on holding, renewed or not. A renew is written into the counter
// first (slot.next).
func (p *pass) settleHolder(g *lockingv1alpha1.LockGrant, own int32) {
	sl := p.slots[own]
	st := &g.Status
	answered := st.Phase == lockingv1alpha1.PhaseHeld
	if !answered {
		// The counter names it but its status was never written
		// (a crash between the two writes): converge on the
		// counter's fence, never issue another.
		p.emit(hold(g, own, p.f.Resource, sl.holder.Fence, p.now))
	}
	// The counter carries the live lease: its end is judged there,
	// and the status mirrors it (the lease end of a status written
	// just now is the counter's, whatever hold computed).
	mirrorLease(g, sl.holder, p.now, answered)
	lapses, serr := p.f.session(g)
	leaseBefore := st.ExpiresAt
	if reason, msg := p.f.revocation(g); reason != "" {
		p.emit(end(g, lockingv1alpha1.PhaseRevoked, reason, msg, p.now, true))
	} else if serr != nil && !g.Spec.Release {
		// Its client is gone: end the grant now rather than at
		// the end of its lease. The fence stays consumed.
		p.emit(end(g, lockingv1alpha1.PhaseExpired, lockingv1alpha1.LockGrantReasonSessionExpired, "Ended before its lease ran out: "+detail(serr), p.now, true))
	} else if e, ended := settleLease(g, p.now); ended {
		p.emit(e...)
	} else {
		p.emit(e...)
		sl.live = true
		p.holding = append(p.holding, g)
		p.deadlines = append(p.deadlines, st.ExpiresAt.Time, lapses)
	}
	if !sl.live {
		p.endedHolders = append(p.endedHolders, g.UID)
	} else if leaseMoved(sl.holder, leaseBefore, st.ExpiresAt) {
		// A renew (or a counter written before it carried the
		// lease): the counter records the new end first, by
		// compare-and-swap, so that a renew and the resource's
		// handoff to the next waiter can never both happen.
		next := sl.counter.Spec.DeepCopy()
		next.Holder.ExpiresAt = lockingv1alpha1.FormatInstant(st.ExpiresAt.Time)
		sl.next = next
	}
}

// settleRequest decides a request not granted yet: it is revoked (its
// policy), withdrawn by its owner, timed out, withdrawn with its session,
// or goes on waiting.
func (p *pass) settleRequest(g *lockingv1alpha1.LockGrant) {
	reason, msg := p.f.revocation(g)
	lapses, serr := p.f.session(g)
	switch {
	case reason != "":
		p.emit(end(g, lockingv1alpha1.PhaseRevoked, reason, msg, p.now, true))
	case g.Spec.Release:
		p.emit(end(g, lockingv1alpha1.PhaseReleased, lockingv1alpha1.LockGrantReasonCancelled, "Request withdrawn before it was granted", p.now, false))
	case !waitDeadline(g).IsZero() && fencing.Expired(waitDeadline(g), p.f.Now):
		p.emit(end(g, lockingv1alpha1.PhaseTimedOut, lockingv1alpha1.LockGrantReasonTimedOut, "Wait limit passed before the resource was granted", p.now, true))
	case serr != nil:
		// Nobody follows the request any more: withdraw it,
		// never grant it, and let the next live waiter in.
		p.emit(end(g, lockingv1alpha1.PhaseReleased, lockingv1alpha1.LockGrantReasonSessionExpired, "Withdrawn before it was granted: "+detail(serr), p.now, true))
	default:
		p.waiting = append(p.waiting, g)
		p.deadlines = append(p.deadlines, waitDeadline(g), lapses)
	}
}

// noteRegression decides whether g's status says a protected resource
// refused its fence as a regression (the annotation a verifier set), and
// warns once when it first does.
func (p *pass) noteRegression(g *lockingv1alpha1.LockGrant) {
	msg, ok := g.Annotations[lockingv1alpha1.FenceRegressionAnnotation]
	if !ok || meta.IsStatusConditionTrue(g.Status.Conditions, lockingv1alpha1.ConditionFenceRegression) {
		return
	}
	setCond(g, lockingv1alpha1.ConditionFenceRegression, metav1.ConditionTrue, lockingv1alpha1.LockGrantReasonFenceRegression, msg, p.now)
	p.emit(Event{Grant: g, Warning: true, Reason: lockingv1alpha1.LockGrantReasonFenceRegression,
		Note: "A protected resource refused this grant's fence as a regression: " + msg})
}

// lockDelay decides, per slot, until when it is held back. A holder that
// leaves its slot without a release keeps the slot from being granted for
// its delay, counted from when this pass saw it leave, so that its
// in-flight effects on resources that cannot check a fence can drain.
// Whatever frees the slot: its lease expired, its session lapsed, it was
// revoked or superseded, its grant was deleted, or the counter names it
// beside another slot it holds (two deciders raced to grant it two, and the
// pass that frees one cannot know whether the other decider's status
// write, naming this slot, landed after its read and was seen by the
// holder). The counter keeps the instant, so the delay survives the
// grant's deletion and a restart.
func (p *pass) lockDelay() {
	for _, sl := range p.slots {
		if sl.counter != nil && sl.counter.Spec.LockDelayUntil != "" {
			t, err := time.Parse(time.RFC3339Nano, sl.counter.Spec.LockDelayUntil)
			if err != nil {
				// Unreadable (edited by hand): nobody is granted the slot
				// until it is corrected.
				t = p.f.Now.Add(lockingv1alpha1.MaxLockDelaySeconds * time.Second)
			}
			sl.delayUntil = t
		}
		if h := sl.holder; !sl.live && h != nil && h.LockDelaySeconds > 0 && !sl.released {
			if until := p.f.Now.Add(time.Duration(h.LockDelaySeconds) * time.Second); until.After(sl.delayUntil) {
				sl.delayUntil = until
			}
		}
		if sl.delayed(p.f.Now) {
			p.deadlines = append(p.deadlines, sl.delayUntil)
		}
	}
}

// fences decides which slots the issuer's epoch has a next fence for. A
// slot whose counter the issuer's epoch cannot pass (its sequence of the
// epoch used up, a fence of a later epoch, the int64 end) is granted to
// nobody: never a fence that carries into the epoch bits, wraps around, or
// names an epoch other than the issuer's. Nor a fence at or below one a
// guarded object recorded (a counter behind it after a reinstall or a
// restore): the head waits, told which epoch to raise to.
func (p *pass) fences() {
	for k, sl := range p.slots {
		_, sl.noFence = p.f.nextFence(k, sl.fence)
	}
}

// admit hands free slots to the waiters, head first: the head gets the
// lowest-numbered free slot below the limit and below its own permits,
// while fewer grants hold than the limit allows. A request is never
// granted a slot it did not ask for: an exclusive request only ever holds
// slot 0, the resource itself, whose fences it takes for the resource's,
// even after a newer request raised the limit. A slot is free when its
// holder ended or is gone, its lock-delay is over and the issuer's epoch
// has a fence for it. Nor does a grant ever get more company than it asked
// for: the head is granted only while fewer grants hold than every
// holder's own permits (and its own), so an exclusive holder is never
// joined by a newer request for permits, and a limit raised by newer
// requests takes effect once the holders that asked for fewer have left.
// When the head cannot be granted nobody behind it is.
func (p *pass) admit() {
	p.limit = Limit(p.holding, p.waiting)
	count := int32(len(p.holding))
	room := p.limit
	for _, g := range p.holding {
		room = min(room, g.Spec.EffectivePermits())
	}
	for len(p.waiting) > 0 && count < min(room, p.waiting[0].Spec.EffectivePermits()) {
		next := p.waiting[0]
		k, ok := p.slotFor(next)
		if !ok {
			break
		}
		p.waiting = p.waiting[1:]
		if !p.grant(next, k) {
			continue
		}
		count++
		room = min(room, next.Spec.EffectivePermits())
	}
}

// slotFor decides the slot the head of the queue is granted: the lowest
// free one below the limit and its own permits (freeSlot). When there is
// none, it notes why the head waits: the lock-delay that ends first, or
// the issuer's epoch having no fence.
func (p *pass) slotFor(head *lockingv1alpha1.LockGrant) (int32, bool) {
	below := min(p.limit, head.Spec.EffectivePermits())
	k, delay, ok := freeSlot(p.slots, below, p.f.Now)
	for ok && p.slots[k] == nil {
		// A slot whose counter does not exist yet: its first fence
		// must be above its floor too.
		_, err := p.f.nextFence(k, 0)
		if err == nil {
			break
		}
		p.slots[k] = &slot{noFence: err}
		k, delay, ok = freeSlot(p.slots, below, p.f.Now)
	}
	if !ok {
		p.headDelay = delay
		p.headNoFence = noFence(p.slots, below)
	}
	return k, ok
}

// grant makes next, the head of the queue, the holder of slot k with the
// slot's next fence, written into its counter first. It reports false when
// next's session is no longer renewed on its cadence: it is withdrawn at
// its turn instead, since a client that missed its session's renewal
// would keep everyone behind it waiting until its session lapsed (a grant
// to it lasts that long).
func (p *pass) grant(next *lockingv1alpha1.LockGrant, k int32) bool {
	if _, err := p.f.renewing(next); err != nil {
		p.emit(end(next, lockingv1alpha1.PhaseReleased, lockingv1alpha1.LockGrantReasonSessionExpired, "Withdrawn at its turn: "+detail(err), p.now, true))
		p.write(next)
		return false
	}
	sl := p.slots[k]
	if sl == nil {
		sl = &slot{}
		p.slots[k] = sl
	}
	fence, _ := p.f.nextFence(k, sl.fence) // freeSlot took only a slot that has one
	sl.fence, sl.live = fence, true
	sl.next = &lockingv1alpha1.FenceCounterSpec{
		Resource: lockingv1alpha1.SlotResource(p.f.Resource, k),
		Fence:    fence,
		Holder: &lockingv1alpha1.FenceHolder{
			Name: next.Name, UID: string(next.UID), Owner: next.Spec.Owner, Fence: fence,
			LockDelaySeconds: next.Spec.LockDelaySeconds,
		},
	}
	p.emit(hold(next, k, p.f.Resource, fence, p.now))
	sl.next.Holder.ExpiresAt = lockingv1alpha1.FormatInstant(next.Status.ExpiresAt.Time)
	next.Status.ObservedRenewals = next.Spec.Renewals
	p.plan.Granted = append(p.plan.Granted, next)
	p.deadlines = append(p.deadlines, next.Status.ExpiresAt.Time)
	p.plan.Statuses = slices.DeleteFunc(p.plan.Statuses, func(g *lockingv1alpha1.LockGrant) bool { return g.UID == next.UID })
	return true
}

// freeSlots decides which counters are cleared: every slot whose holder
// ended or is gone, or whose counter names a grant that holds another
// slot, and that was not granted again, is freed with the end of its
// lock-delay.
func (p *pass) freeSlots() {
	for _, k := range slotNumbers(p.slots) {
		sl := p.slots[k]
		if sl.next != nil || sl.live || sl.holder == nil {
			continue
		}
		sl.next = &lockingv1alpha1.FenceCounterSpec{Resource: lockingv1alpha1.SlotResource(p.f.Resource, k), Fence: sl.fence}
		if sl.delayed(p.f.Now) {
			sl.next.LockDelayUntil = sl.delayUntil.UTC().Format(time.RFC3339Nano)
		}
	}
}

// counters puts the counters that change into the plan: slot 0's as
// Counter, the others' in SlotCounters.
func (p *pass) counters() {
	for k, sl := range p.slots {
		switch {
		case sl.next == nil:
		case k == 0:
			p.plan.Counter = sl.next
		default:
			if p.plan.SlotCounters == nil {
				p.plan.SlotCounters = map[int32]*lockingv1alpha1.FenceCounterSpec{}
			}
			p.plan.SlotCounters[k] = sl.next
		}
	}
}

// limits decides the WithinLimit condition of the holders: those whose
// slot is at or above a lowered limit keep it, and the condition says so.
func (p *pass) limits() {
	for _, g := range p.holding {
		old := g.Status.DeepCopy()
		withinLimit(g, p.limit, p.now)
		if !equalStatus(old, &g.Status) {
			p.write(g)
		}
	}
}

// positions decides the queue positions of those still waiting, written
// when a request joins the queue and when it becomes the next in line,
// never in between: a handoff then costs the same writes whatever the
// queue's length (a live position of every waiter is computed on read,
// from the queue). The head is told why it waits.
func (p *pass) positions() {
	for i, g := range p.waiting {
		pos := int32(i)
		old := g.Status.DeepCopy()
		joins := g.Status.Phase != lockingv1alpha1.PhasePending
		g.Status.Phase = lockingv1alpha1.PhasePending
		if joins || pos == 0 || g.Status.QueuePosition == nil {
			g.Status.QueuePosition = &pos
		}
		switch {
		case !p.headDelay.IsZero() && i == 0:
			setReady(g, metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonLockDelay, "Next in line; the last holder's lease ended without a release, so the resource is granted again at "+p.headDelay.UTC().Format(time.RFC3339Nano)+" (lock-delay)", p.now)
		case p.headNoFence != nil && i == 0:
			p.emit(heldBack(g, p.f.Resource, p.headNoFence, p.now)...)
		default:
			setReady(g, metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonPending, "Waiting in the queue for the resource", p.now)
		}
		if !equalStatus(old, &g.Status) {
			p.write(g)
		}
	}
}

// statusOrder decides the order of the status writes, all after the
// counters: the ended holders first, so that no two grants of one slot
// ever read Held at once, then the new holders, then the rest.
func (p *pass) statusOrder() {
	ended := func(g *lockingv1alpha1.LockGrant) bool { return slices.Contains(p.endedHolders, g.UID) }
	first := slices.DeleteFunc(slices.Clone(p.plan.Statuses), func(g *lockingv1alpha1.LockGrant) bool { return !ended(g) })
	rest := slices.DeleteFunc(p.plan.Statuses, ended)
	p.plan.Statuses = slices.Concat(first, p.plan.Granted, rest)
}

// requeue decides when the next pass is due: at the earliest deadline
// after now. A grant that ends in this pass is deleted once its retention
// has passed, and this pass asks for that pass: the status write that ends
// it starts no pass of its own (a replica ignores its own writes).
func (p *pass) requeue() {
	if p.f.Retention > 0 {
		for _, g := range p.plan.Statuses {
			if g.Status.Phase.Final() && g.Status.EndedAt != nil {
				p.deadlines = append(p.deadlines, g.Status.EndedAt.Add(p.f.Retention))
			}
		}
	}
	for _, d := range p.deadlines {
		if d.IsZero() {
			continue
		}
		if wait := d.Sub(p.f.Now); wait > 0 && (p.plan.RequeueAfter == 0 || wait < p.plan.RequeueAfter) {
			p.plan.RequeueAfter = wait
		}
	}
}

// Limit is the number of permits in force for a resource: the permits of
// its most recently requested live grant, in FIFO order, among those
// holding and those waiting; 1 when there is none. Every request for a
// resource should name the same permits; a new value takes effect with the
// requests that name it.
func Limit(holding, waiting []*lockingv1alpha1.LockGrant) int32 {
	var last *lockingv1alpha1.LockGrant
	for _, g := range slices.Concat(holding, waiting) {
		if last == nil || fifo(*g, *last) > 0 {
			last = g
		}
	}
	if last == nil {
		return 1
	}
	return min(last.Spec.EffectivePermits(), lockingv1alpha1.MaxPermits)
}

// ownSlot is the slot a grant holds, given the slots whose counter names it
// (lowest first): the one its status names once it is Held or ended
// (slot 0 when its status names none), else the lowest, which the pass
// then converges it on. It reports false when no counter names it in that
// slot.
func ownSlot(g *lockingv1alpha1.LockGrant, named []int32, slots map[int32]*slot) (int32, bool) {
	if len(named) == 0 {
		return 0, false
	}
	if g.Status.Phase == lockingv1alpha1.PhaseHeld || g.Status.Phase.Final() {
		k := g.HeldSlot()
		return k, slices.Contains(named, k) && slots[k] != nil
	}
	return named[0], true
}

// noteRelease records, on each slot whose counter names g (named), whether
// g ends released by its owner as this pass leaves it: only then is a slot
// it leaves freed without its lock-delay. A release ends every slot the
// grant is named by; a request withdrawn because its session lapsed was not
// released by its owner.
func noteRelease(slots map[int32]*slot, named []int32, g *lockingv1alpha1.LockGrant) {
	released := g.Spec.Release && g.Status.Phase == lockingv1alpha1.PhaseReleased
	for _, k := range named {
		slots[k].released = released
	}
}

// freeSlot returns the lowest-numbered slot below limit that may be granted
// now. When none may, it returns the earliest end of a lock-delay that
// holds one back (zero when none does).
func freeSlot(slots map[int32]*slot, limit int32, now time.Time) (int32, time.Time, bool) {
	var delay time.Time
	for k := range limit {
		sl := slots[k]
		if sl == nil {
			return k, time.Time{}, true
		}
		if sl.live || sl.noFence != nil {
			continue
		}
		if sl.delayed(now) {
			if delay.IsZero() || sl.delayUntil.Before(delay) {
				delay = sl.delayUntil
			}
			continue
		}
		return k, time.Time{}, true
	}
	return 0, delay, false
}

// noFence is why the lowest slot below limit that does not hold cannot be
// granted: the issuer's epoch has no fence for it. nil when there is none
// such.
func noFence(slots map[int32]*slot, limit int32) error {
	for k := range limit {
		if sl := slots[k]; sl != nil && !sl.live && sl.noFence != nil {
			return sl.noFence
		}
	}
	return nil
}

// heldBack says on the head of the queue g why it is not granted although
// the resource is free: the issuer's epoch has no fence above the
// resource's (err, from fencing.NextFence). The Warning Event, also sent
// regarding the FenceIssuer where the operator acts, is emitted when the
// condition first says so.
func heldBack(g *lockingv1alpha1.LockGrant, resource string, err error, now metav1.MicroTime) []Event {
	reason := fencing.ReasonOf(err).ConditionReason()
	msg := fmt.Sprintf("Next in line, but resource %q cannot be granted: %s", resource, detail(err))
	was := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady)
	setReady(g, metav1.ConditionFalse, reason, msg, now)
	if was != nil && was.Reason == reason && was.Message == msg {
		return nil
	}
	return []Event{{Grant: g, Warning: true, Reason: reason, Note: msg, Issuer: true}}
}

func (sl *slot) delayed(now time.Time) bool {
	return !sl.delayUntil.IsZero() && !fencing.Expired(sl.delayUntil, now)
}

func slotNumbers(slots map[int32]*slot) []int32 {
	ks := make([]int32, 0, len(slots))
	for k := range slots {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// withinLimit sets the WithinLimit condition of a live holder: False
// (OverLimit) while its slot is at or above the limit, True again once it
// is below after having been False. An exclusive lock never gets it.
func withinLimit(g *lockingv1alpha1.LockGrant, limit int32, now metav1.MicroTime) {
	k := g.HeldSlot()
	if k >= limit {
		setCond(g, lockingv1alpha1.ConditionWithinLimit, metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonOverLimit,
			fmt.Sprintf("Holds permit %d while the resource's limit is %s; it keeps its permit and fence until it is released or expires, and nobody is granted while %d or more grants hold", k, permits(limit), limit), now)
		return
	}
	if c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionWithinLimit); c != nil && c.Status != metav1.ConditionTrue {
		setCond(g, lockingv1alpha1.ConditionWithinLimit, metav1.ConditionTrue, lockingv1alpha1.LockGrantReasonWithinLimit,
			fmt.Sprintf("Holds permit %d within the resource's limit of %s", k, permits(limit)), now)
	}
}

// detail is the sentence of a refusal, without its reason code.
func detail(err error) string {
	var e *fencing.Error
	if errors.As(err, &e) {
		return e.Detail
	}
	return err.Error()
}

// quiet reports whether a grant is final and needs nothing: no deletion
// due, no retention deadline to wait for, no regression to raise.
func quiet(g *lockingv1alpha1.LockGrant, f Facts) bool {
	if !g.Status.Phase.Final() || f.Retention > 0 {
		return false
	}
	if _, ok := g.Annotations[lockingv1alpha1.FenceRegressionAnnotation]; ok {
		return meta.IsStatusConditionTrue(g.Status.Conditions, lockingv1alpha1.ConditionFenceRegression)
	}
	return true
}

// hold makes g Held in slot k of resource with fence from now. The slot is
// written in the status unless it is slot 0 of a grant that asks for one
// permit, whose status stays that of an exclusive lock.
func hold(g *lockingv1alpha1.LockGrant, k int32, resource string, fence int64, now metav1.MicroTime) Event {
	st := &g.Status
	st.Phase = lockingv1alpha1.PhaseHeld
	st.FenceToken = fence
	st.Permit, st.FencedResource = nil, ""
	if k > 0 || g.Spec.EffectivePermits() > 1 {
		st.Permit, st.FencedResource = &k, lockingv1alpha1.SlotResource(resource, k)
	}
	st.QueuePosition = nil
	st.GrantedAt = &now
	exp := leaseEnd(now, g)
	st.ExpiresAt = &exp
	setReady(g, metav1.ConditionTrue, lockingv1alpha1.LockGrantReasonGranted, "Held with fence "+fencing.FormatFence(fence), now)
	return Event{Grant: g, Reason: lockingv1alpha1.LockGrantReasonGranted, Note: "Granted with fence " + fencing.FormatFence(fence)}
}

// leaseEnd is the end of a lease of g granted or renewed at now, to the
// microsecond: the precision a status keeps, so that the counter and the
// status say the same instant.
func leaseEnd(now metav1.MicroTime, g *lockingv1alpha1.LockGrant) metav1.MicroTime {
	return metav1.NewMicroTime(now.Add(ttl(g)).Truncate(time.Microsecond))
}

// mirrorLease sets a holder's status.expiresAt to the lease end its counter
// records. A counter written before it carried the lease leaves the status
// as it is; one whose value cannot be read ends the lease now (fail
// closed). A status that says later than a counter whose lease is still
// live keeps its end, and the pass writes it into the counter (leaseMoved):
// a controller of an earlier version, during a rolling upgrade, renews in
// the status alone, and its answer must hold. Once the counter's lease is
// over, the counter wins: admission has refused the holder since. answered
// says the status was Held as read, not made so by this pass.
func mirrorLease(g *lockingv1alpha1.LockGrant, h *lockingv1alpha1.FenceHolder, now metav1.MicroTime, answered bool) {
	end, ok, err := h.LeaseEnd()
	switch {
	case !ok:
		return
	case err != nil:
		end = now.Time
	case answered && g.Status.ExpiresAt != nil && g.Status.ExpiresAt.After(end) && !fencing.Expired(end, now.Time):
		return
	}
	if cur := g.Status.ExpiresAt; cur == nil || !cur.Equal(&metav1.MicroTime{Time: end}) {
		exp := metav1.NewMicroTime(end)
		g.Status.ExpiresAt = &exp
	}
}

// leaseMoved reports whether the counter must record a live holder's lease
// end anew: this pass moved it from before to after (a renew), or the
// counter records another. A counter written before it carried the lease
// is left as it is until the holder renews.
func leaseMoved(h *lockingv1alpha1.FenceHolder, before, after *metav1.MicroTime) bool {
	if after == nil {
		return false
	}
	if !equalTime(before, after) {
		return true
	}
	end, ok, err := h.LeaseEnd()
	return ok && (err != nil || !end.Equal(after.Time))
}

// settleLease applies the holder's release, expiry or renew. It reports
// whether the grant ended.
func settleLease(g *lockingv1alpha1.LockGrant, now metav1.MicroTime) ([]Event, bool) {
	st := &g.Status
	expired := fencing.Expired(st.ExpiresAt.Time, now.Time)
	var evs []Event
	if g.Spec.Renewals > st.ObservedRenewals {
		st.ObservedRenewals = g.Spec.Renewals
		switch {
		case expired:
			setCond(g, lockingv1alpha1.ConditionRenewed, metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonExpired, "Renew arrived after the lease expired; acquire again for a new fence", now)
			evs = append(evs, Event{Grant: g, Warning: true, Reason: lockingv1alpha1.LockGrantReasonExpired, Note: "Renew refused: the lease had expired"})
		case g.Spec.Release:
			// The renew lost the race to the release: the grant ends
			// released, and the renew is answered with why.
			setCond(g, lockingv1alpha1.ConditionRenewed, metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonAlreadyEnded, "Renew arrived together with the release; the grant is released", now)
		default:
			exp := leaseEnd(now, g)
			st.ExpiresAt = &exp
			st.LastRenewTime = &now
			setCond(g, lockingv1alpha1.ConditionRenewed, metav1.ConditionTrue, lockingv1alpha1.LockGrantReasonRenewed, "Lease extended to "+exp.UTC().Format(time.RFC3339Nano), now)
			setReady(g, metav1.ConditionTrue, lockingv1alpha1.LockGrantReasonGranted, "Held with fence "+fencing.FormatFence(st.FenceToken), now)
		}
	}
	switch {
	case g.Spec.Release && !expired:
		return append(evs, end(g, lockingv1alpha1.PhaseReleased, lockingv1alpha1.LockGrantReasonReleased, "Released by its owner", now, false)), true
	case expired:
		return append(evs, end(g, lockingv1alpha1.PhaseExpired, lockingv1alpha1.LockGrantReasonExpired, "Lease expired at "+st.ExpiresAt.UTC().Format(time.RFC3339Nano), now, true)), true
	}
	return evs, false
}

// endHeldNotHolder ends a grant that is Held in its status but no longer
// the counter's holder, with the reason it most likely ended for: released,
// expired, its session lapsed (serr), or superseded.
func endHeldNotHolder(g *lockingv1alpha1.LockGrant, serr error, now metav1.MicroTime) Event {
	switch {
	case g.Spec.Release:
		return end(g, lockingv1alpha1.PhaseReleased, lockingv1alpha1.LockGrantReasonReleased, "Released by its owner", now, false)
	case g.Status.ExpiresAt != nil && fencing.Expired(g.Status.ExpiresAt.Time, now.Time):
		return end(g, lockingv1alpha1.PhaseExpired, lockingv1alpha1.LockGrantReasonExpired, "Lease expired at "+g.Status.ExpiresAt.UTC().Format(time.RFC3339Nano), now, true)
	case serr != nil:
		return end(g, lockingv1alpha1.PhaseExpired, lockingv1alpha1.LockGrantReasonSessionExpired, "Ended before its lease ran out: "+detail(serr), now, true)
	}
	return end(g, lockingv1alpha1.PhaseExpired, lockingv1alpha1.LockGrantReasonSuperseded, "The resource's fence record names another holder", now, true)
}

func end(g *lockingv1alpha1.LockGrant, phase lockingv1alpha1.LockGrantPhase, reason, msg string, now metav1.MicroTime, warning bool) Event {
	g.Status.Phase = phase
	g.Status.QueuePosition = nil
	g.Status.EndedAt = &now
	setReady(g, metav1.ConditionFalse, reason, msg, now)
	return Event{Grant: g, Warning: warning, Reason: reason, Note: msg}
}

func setReady(g *lockingv1alpha1.LockGrant, s metav1.ConditionStatus, reason, msg string, now metav1.MicroTime) {
	setCond(g, lockingv1alpha1.ConditionReady, s, reason, msg, now)
}

func setCond(g *lockingv1alpha1.LockGrant, t string, s metav1.ConditionStatus, reason, msg string, now metav1.MicroTime) {
	meta.SetStatusCondition(&g.Status.Conditions, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: msg,
		ObservedGeneration: g.Generation, LastTransitionTime: metav1.NewTime(now.Time),
	})
}

// equalStatus compares two statuses field by field (a reflective deep
// comparison dominated the controller's CPU time).
func equalStatus(a, b *lockingv1alpha1.LockGrantStatus) bool {
	if a.Phase != b.Phase || a.FenceToken != b.FenceToken || a.ObservedRenewals != b.ObservedRenewals || a.Proof != b.Proof ||
		a.FencedResource != b.FencedResource || !equalPtr(a.Permit, b.Permit) ||
		!equalPtr(a.QueuePosition, b.QueuePosition) || !equalPtr(a.Record, b.Record) ||
		!equalTime(a.GrantedAt, b.GrantedAt) || !equalTime(a.ExpiresAt, b.ExpiresAt) ||
		!equalTime(a.LastRenewTime, b.LastRenewTime) || !equalTime(a.EndedAt, b.EndedAt) ||
		len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message ||
			x.ObservedGeneration != y.ObservedGeneration || !x.LastTransitionTime.Equal(&y.LastTransitionTime) {
			return false
		}
	}
	return true
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func equalTime(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

// permits says n permits in words: "1 permit", "3 permits".
func permits(n int32) string {
	if n == 1 {
		return "1 permit"
	}
	return fmt.Sprintf("%d permits", n)
}

// CounterWrite is one counter write of a plan: slot Slot's counter gets
// Spec.
type CounterWrite struct {
	Slot int32
	Spec *lockingv1alpha1.FenceCounterSpec
}

// CounterWrites returns the counter writes of p, in the order they must be
// written: first the writes that grant no new holder (a holder ends or
// renews), then those that do, each group by slot. The counters are
// separate objects, written one compare-and-swap at a time; in this order a
// permit its holder gives up is free before any other is granted, so no
// more grants ever hold than the plan allows, between any two writes too.
func CounterWrites(f Facts, p Plan) []CounterWrite {
	var ending, granting []CounterWrite
	add := func(k int32, next *lockingv1alpha1.FenceCounterSpec) {
		cur := f.Counter
		if k > 0 {
			cur = f.SlotCounters[k]
		}
		w := CounterWrite{Slot: k, Spec: next}
		if next.Holder != nil && (cur == nil || cur.Spec.Holder == nil || cur.Spec.Holder.UID != next.Holder.UID) {
			granting = append(granting, w)
		} else {
			ending = append(ending, w)
		}
	}
	if p.Counter != nil {
		add(0, p.Counter)
	}
	for _, k := range slices.Sorted(maps.Keys(p.SlotCounters)) {
		add(k, p.SlotCounters[k])
	}
	return append(ending, granting...)
}

// NewlyHeld lists the grants p writes Held whose status, as f gathered
// it, is not Held: those the pass makes holders in their status. Before
// such a status is written, no other grant of the resource may still be
// Held as stored; a cache that is behind can hide one (a status written
// before a swap the cache has not seen), so the pass confirms the
// resource's grants on a direct read first, unless CacheCovers says the
// cache already shows every status stored before the counters.
func NewlyHeld(f Facts, p Plan) []types.UID {
	var uids []types.UID
	for _, g := range p.Statuses {
		if g.Status.Phase != lockingv1alpha1.PhaseHeld {
			continue
		}
		i := slices.IndexFunc(f.Grants, func(c lockingv1alpha1.LockGrant) bool { return c.UID == g.UID })
		if i < 0 || f.Grants[i].Status.Phase != lockingv1alpha1.PhaseHeld {
			uids = append(uids, g.UID)
		}
	}
	return uids
}
