package sim

import (
	"maps"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// scheduleAdversary plans the round's injected faults that do not belong to
// a worker: forged, tampered and replayed proofs, epoch revocation, and a
// restore from an old snapshot.
func (w *world) scheduleAdversary() {
	for _, f := range []Fault{FaultForgedFence, FaultTamperedRecord, FaultReplay} {
		if !w.fault[f] {
			continue
		}
		for range 3 {
			w.s.after(w.between(2*time.Second, w.horizon-10*time.Second), func() { w.inject(f) })
		}
	}
	if w.fault[FaultRevokedEpoch] {
		w.s.after(w.between(10*time.Second, w.horizon/2), func() {
			w.rep.Faults[string(FaultRevokedEpoch)]++
			g := w.heldGrant()
			w.bumpEpoch()
			if g == nil {
				return
			}
			// A write of the revoked grant still in flight lands after the
			// revocation, before and after the controller ends the grant.
			msg := grantWrite(g, w.resource, "revoked")
			w.s.after(0, func() { w.deliver(msg) })
			w.s.after(w.between(100*time.Millisecond, 5*time.Second), func() { w.deliver(msg) })
		})
	}
	if w.fault[FaultRestore] {
		t1 := w.between(5*time.Second, w.horizon/3)
		var snap *snapshot
		var objs map[string]object
		var issued map[string]int64
		w.s.at(t1, func() {
			snap = w.reg.snapshot()
			issued = maps.Clone(w.objIssued)
			objs = map[string]object{}
			for k, o := range w.objects {
				objs[k] = *o
			}
		})
		t2 := t1 + w.between(5*time.Second, 40*time.Second)
		w.s.at(t2, func() {
			w.rep.Faults[string(FaultRestore)]++
			for uid, g := range snap.grants {
				if !g.Status.Phase.Final() {
					w.resurrected[uid] = true
				}
			}
			w.reg.restore(snap)
			w.restoredAt = w.s.now
			for _, rp := range w.replicas {
				// The watches' resourceVersions are gone: the
				// informers list again, and what was written before is
				// no longer this replica's to stand in for.
				rp.cache.relist(w.reg)
				clear(rp.cache.ownCounters)
				clear(rp.cache.ownStatuses)
				// The API servers were stopped for the restore
				// (docs/segments.md, the runbook), far longer than the
				// status writer retries: the statuses it had queued
				// were dropped.
				for res := range rp.cache.writers {
					rp.cache.drops[res]++
				}
				clear(rp.cache.writers)
			}
			for k, o := range objs {
				*w.objects[k] = o // guarded objects live in the same etcd
			}
			w.objIssued = issued
			w.kick(w.resource)
			for _, k := range w.workers {
				k.notify()
			}
			// The operator notices the FENCE_REGRESSION alarm and bumps the
			// epoch past every epoch ever used, revoking the restored one
			// (docs/segments.md).
			w.s.after(w.between(time.Second, 30*time.Second), func() {
				w.bumpEpoch()
				w.recovered = true
			})
		})
	}
}

// bumpEpoch moves the issuer to an epoch above every epoch ever used and
// revokes the current one.
func (w *world) bumpEpoch() {
	w.reg.revoked = append(w.reg.revoked, w.reg.epoch)
	w.maxEpoch = max(w.maxEpoch, w.reg.epoch) + 1
	w.reg.epoch = w.maxEpoch
	w.kick(w.resource)
}

// heldGrant returns a grant the registry reports Held, or nil.
func (w *world) heldGrant() *lockingv1alpha1.LockGrant {
	var best *lockingv1alpha1.LockGrant
	for _, g := range w.reg.grants {
		if g.Status.Phase == lockingv1alpha1.PhaseHeld && g.Status.Proof != "" && (best == nil || g.UID < best.UID) {
			best = g
		}
	}
	return best
}

// grantWrite is an apply of object target stamped with grant g's claim and
// proof, as its holder would send it.
func grantWrite(g *lockingv1alpha1.LockGrant, target, data string) writeMsg {
	return writeMsg{op: fencing.OpUpdate, upsert: true, body: bodyStamped, caller: g.Spec.Owner, target: target, data: data,
		uid: g.UID, fence: g.Status.FenceToken, proof: fencing.Proof(g.Status.Proof)}
}

// inject sends one forged, tampered or replayed write built from a real
// grant's proof.
func (w *world) inject(f Fault) {
	g := w.heldGrant()
	if g == nil {
		return
	}
	w.rep.Faults[string(f)]++
	proof := fencing.Proof(g.Status.Proof)
	msg := grantWrite(g, w.resource, "injected")
	msg.injected = string(f)
	switch f {
	case FaultForgedFence:
		// A huge fence with a real proof, and one in a re-signed record.
		msg.fence = 1<<62 + w.rng.Int64N(1000)
		if w.chance(0.5) {
			r, sig, _ := fencing.ParseProof(proof)
			r.Fence = msg.fence
			msg.proof = fencing.FormatProof(r, sig)
		}
	case FaultTamperedRecord:
		r, sig, err := fencing.ParseProof(proof)
		if err != nil {
			return
		}
		v := reflect.ValueOf(&r).Elem()
		field := v.Field(w.rng.IntN(v.NumField()))
		switch field.Kind() {
		case reflect.String:
			field.SetString(field.String() + "x")
		case reflect.Int64:
			field.SetInt(field.Int() + 1 + w.rng.Int64N(5))
		}
		msg.proof = fencing.FormatProof(r, sig)
		if r.Fence != g.Status.FenceToken {
			msg.fence = r.Fence
		}
		if r.LeaseID != string(g.UID) {
			msg.uid = types.UID(r.LeaseID)
		}
	case FaultReplay:
		if w.chance(0.5) {
			msg.target = w.other // another resource
		} else {
			msg.caller = "system:serviceaccount:billing:intruder" // another owner
		}
	}
	w.s.after(w.netDelay(), func() { w.deliver(msg) })
	// The same forgery against the segment store, where it applies.
	if f == FaultForgedFence {
		seg := fencing.Segment{Fence: msg.fence, GrantUID: string(g.UID), Root: "forged", Seq: 1,
			Digest: fencing.PayloadDigest([]byte("forged"))}
		w.s.after(w.netDelay(), func() { w.deliverSegment(segMsg{caller: g.Spec.Owner, seg: seg, injected: string(f)}) })
	}
}
