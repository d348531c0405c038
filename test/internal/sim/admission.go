package sim

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// admissionLagFault counts the writes cached admission accepts that the
// registry's facts at that instant would refuse: accepted from a replica's
// cached counter that still named the write's grant, with its fence and a
// lease end not passed, while the registry had already ended the grant (a
// release, revocation, forced release, lapsed session, a swap to the next
// holder) and the object had not yet accepted a higher fence
// (docs/faults.md).
const admissionLagFault = "accepted-in-admission-lag"

// admit is the guarded-write webhook's decision on r, on the replica the
// API server's Service sends it to (a random one, a frozen one included:
// its watches have stalled, not its webhook server), as
// webhook/guard.Checker makes it with --guard-reads=cached: first on the
// counter the replica's informer shows, only when it names the claimed
// grant with its lease, answering only an acceptance
// (fencing.AcceptFromCache); then on the registry's facts, read
// linearizably, which alone refuse. cachedBy is the replica whose cache
// accepted, nil when the registry's facts decided. In rounds without
// replicas every decision is on the registry's facts.
func (w *world) admit(r fencing.GuardedRequest, resource string) (rec fencing.Accepted, cachedBy *replica, err error) {
	_, name, ok := r.Target()
	if !ok {
		rec, err = fencing.CheckGuardedRequest(r)
		return rec, nil, err
	}
	if rp := w.answering(); rp != nil {
		ct := rp.cache.counters[resource]
		if facts.HolderGrant(ct, name) != nil || w.broken == brokenRefuseFromCache {
			cr := r
			cr.Grant, cr.Counter = facts.Registry(name, nil, ct)
			if rec, ok := fencing.AcceptFromCache(cr); ok {
				return rec, rp, nil
			}
			if w.broken == brokenRefuseFromCache {
				// Decided on whatever the cache shows, without the
				// direct read before a refusal.
				if rec, err = fencing.CheckGuardedRequest(cr); err != nil {
					return rec, nil, err
				}
			}
		}
	}
	r.Grant, r.Counter = w.reg.facts(types.UID(name), resource)
	rec, err = fencing.CheckGuardedRequest(r)
	return rec, nil, err
}

// answering is the replica that answers the next guarded write; nil in
// rounds without replicas (or before they start).
func (w *world) answering() *replica {
	if len(w.replicas) == 0 {
		return nil
	}
	return w.replicas[w.admission.IntN(len(w.replicas))]
}

// inAdmissionLag reports whether an acceptance by rp's cache of a write of
// grant uid at fence is in the window cached admission adds, judged by the
// oracle on rp's cache itself: its counter named uid with that fence and a
// lease end that had not passed at now by the webhook's clock, and fence is
// no lower than the highest the object accepted (highest); and by the
// history, the grant's latest lease end had not passed either (a write
// after it is never in the window). false for nil rp.
func (w *world) inAdmissionLag(rp *replica, resource string, uid types.UID, fence, highest int64, now time.Duration) bool {
	if rp == nil || fence < highest || now >= w.h.expiresAt[uid] {
		return false
	}
	c := rp.cache.counters[resource]
	if c == nil || c.Spec.Holder == nil || types.UID(c.Spec.Holder.UID) != uid || c.Spec.Holder.Fence != fence {
		return false
	}
	end, ok, err := c.Spec.Holder.LeaseEnd()
	return ok && err == nil && w.reg.wall(now).Before(end)
}

// checkRefusedOnRegistry counts a refusal of the current holder's own
// stamped write, with its issued fence, that the registry's facts at that
// instant accept: a refusal decided on a cache behind the registry (a
// successor refused because the cache still names the holder before it).
// Admission reads the registry before any refusal, so there must be none.
func (w *world) checkRefusedOnRegistry(m writeMsg, op fencing.Operation, r fencing.GuardedRequest, stored object, reason fencing.Reason, now time.Duration) {
	if !m.asserts() || m.injected != "" || op == fencing.OpDelete || m.fence != w.h.fenceOf[m.uid] ||
		!w.current(m.uid, w.objIssued[stored.resource], now) {
		return
	}
	_, name, ok := r.Target()
	if !ok {
		return
	}
	r.Grant, r.Counter = w.reg.facts(types.UID(name), stored.resource)
	if _, err := fencing.CheckGuardedRequest(r); err != nil {
		return
	}
	w.rep.SuccessorRefused++
	w.rep.violate("seed %d: the current holder %s (fence %d) was refused %s on %s at %s, which the registry's facts accept", w.seed, m.uid, m.fence, reason, m.target, now)
}

// inFlightAtRelease, in rounds with replicas, sometimes has a write of k's
// that was sent before its release (a retry, say) land after the release:
// mostly 1-80 ms after it, in the milliseconds in which the counter's swap
// and the replicas' watches move, the writes cached admission's window is
// about; otherwise up to 3 s after it, when a frozen replica's cache may
// still name k while the successor has written the object. Its delay is
// drawn from the admission stream, so the rest of the round's schedule
// stays as it was.
func (w *world) inFlightAtRelease(k *worker) {
	if len(w.replicas) == 0 || k.uid == "" || w.admission.Float64() >= 0.5 {
		return
	}
	w.rep.Faults["write-in-flight-at-release"]++
	msg := k.stamped(w.resource, string(k.uid))
	d := time.Millisecond + time.Duration(w.admission.Int64N(int64(80*time.Millisecond)))
	if w.admission.Float64() < 0.3 {
		d = 80*time.Millisecond + time.Duration(w.admission.Int64N(int64(3*time.Second)))
	}
	w.s.after(d, func() { w.deliver(msg) })
}
