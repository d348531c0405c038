package sim

import (
	"math"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// intruder is an identity that holds no grant.
const intruder = "system:serviceaccount:billing:c"

// The requests of this file go the ways around a guarded object:
// replicas sharing one identity, writes that assert nothing, unguarded
// look-alikes, subresources and deletes. Each is sent as the client would
// (kubectl patch, a RetryOnConflict loop, kubectl delete, kubectl scale,
// an eviction) by a sender the oracle knows the truth about.

// scheduleDoors plans the round's requests of the guarded-object faults.
func (w *world) scheduleDoors() {
	plan := []struct {
		f    Fault
		n    int
		send func()
	}{
		{FaultSharedIdentity, 4, w.strayReplica},
		{FaultUnasserted, 4, w.unasserted},
		{FaultLookalike, 2, w.lookalikeCycle},
		{FaultSubresource, 4, w.subresourceWrite},
		{FaultDelete, 3, w.deleteCycle},
	}
	for _, p := range plan {
		if !w.fault[p.f] {
			continue
		}
		for range p.n {
			w.s.after(w.between(5*time.Second, w.horizon-10*time.Second), p.send)
		}
	}
}

// holder returns the worker that holds the registry's Held grant and knows
// its fence, or nil.
func (w *world) holder() *worker {
	g := w.heldGrant()
	if g == nil {
		return nil
	}
	for _, k := range w.workers {
		if k.uid == g.UID && k.fence == g.Status.FenceToken && k.fence > 0 {
			return k
		}
	}
	return nil
}

// stale returns a worker whose grant is, by the history, no longer the
// current holder's (superseded, ended or expired), or nil.
func (w *world) stale() *worker {
	n := len(w.workers)
	start := w.rng.IntN(n)
	for i := range n {
		k := w.workers[(start+i)%n]
		if k.uid != "" && k.fence > 0 && !w.current(k.uid, w.objIssued[w.resource], w.s.now) {
			return k
		}
	}
	return nil
}

// sender is who sends a request that is not the holder's own stamped write.
type sender struct {
	caller string
	uid    types.UID
	fence  int64
	proof  fencing.Proof
}

func senderOf(k *worker) sender {
	return sender{caller: k.name, uid: k.uid, fence: k.fence, proof: k.proof}
}

// anySender picks the current holder, a stale worker or the intruder.
func (w *world) anySender() sender {
	switch w.rng.IntN(3) {
	case 0:
		if h := w.holder(); h != nil {
			return senderOf(h)
		}
	case 1:
		if k := w.stale(); k != nil {
			return senderOf(k)
		}
	}
	return sender{caller: intruder}
}

// msg is a request by s to target that asserts nothing of its own.
func (s sender) msg(op fencing.Operation, b body, target, data string) writeMsg {
	return writeMsg{op: op, body: b, caller: s.caller, target: target, data: data, uid: s.uid, fence: s.fence, proof: s.proof}
}

// stamped is s's apply of target with its own claim.
func (s sender) stamped(target, data string) writeMsg {
	m := s.msg(fencing.OpUpdate, bodyStamped, target, data)
	m.upsert, m.writeID = true, newWriteID()
	return m
}

// send delivers m after a network hop.
func (w *world) send(m writeMsg) { w.s.after(w.netDelay(), func() { w.deliver(m) }) }

// rereadUpdate GETs target and PUTs it back as read with new data and the
// read version's precondition, without restamping; on a conflict it reads
// again, up to tries times (client-go's RetryOnConflict).
func (w *world) rereadUpdate(s sender, target, sub, data string, tries int) {
	w.s.after(w.netDelay(), func() {
		obj := w.objects[target]
		if !obj.exists {
			return
		}
		read := *obj
		m := s.msg(fencing.OpUpdate, bodyAsRead, target, data)
		m.sub, m.read, m.precondition = sub, &read, read.rv
		m.onAnswer = func(_ bool, reason fencing.Reason, _ int64) {
			if reason == reasonConflict && tries > 1 {
				w.rereadUpdate(s, target, sub, data, tries-1)
			}
		}
		w.send(m)
	})
}

// readThenDelete GETs target and deletes it with the read version as
// precondition.
func (w *world) readThenDelete(s sender, target string) {
	w.s.after(w.netDelay(), func() {
		obj := w.objects[target]
		if !obj.exists {
			return
		}
		m := s.msg(fencing.OpDelete, bodyNone, target, "")
		m.precondition = obj.rv
		w.send(m)
	})
}

// strayReplica: a replica of the holder's Deployment whose grant was
// superseded goes on as its code does: a merge patch of data only, a
// re-read and update without restamping, a bare delete, or its own old
// claim.
func (w *world) strayReplica() {
	k := w.stale()
	if k == nil {
		return
	}
	w.rep.Faults[string(FaultSharedIdentity)]++
	s := senderOf(k)
	switch w.rng.IntN(4) {
	case 0:
		w.send(s.msg(fencing.OpUpdate, bodyMerge, w.resource, "STALE"))
	case 1:
		w.rereadUpdate(s, w.resource, "", "STALE", 3)
	case 2:
		w.send(s.msg(fencing.OpDelete, bodyNone, w.resource, ""))
	default:
		w.send(s.stamped(w.resource, "STALE"))
	}
}

// unasserted: a merge patch of data only or a re-read update without
// restamping, from the holder, a stale worker or the intruder.
func (w *world) unasserted() {
	w.rep.Faults[string(FaultUnasserted)]++
	s := w.anySender()
	if w.chance(0.5) {
		w.send(s.msg(fencing.OpUpdate, bodyMerge, w.resource, "UNASSERTED"))
		return
	}
	w.rereadUpdate(s, w.resource, "", "UNASSERTED", 3)
}

// lookalikeCycle: while the look-alike object does not exist, a stale
// worker or the intruder creates it unguarded with a forged record (the
// largest fence) and a forged claim (a bogus one, or exactly the claim the
// holder is about to make); the holder then puts it under guard with its
// own stamped write, which must be accepted; then a stale writer tries a
// merge patch and a re-read update. A look-alike left from an earlier
// cycle is first deleted by the holder.
func (w *world) lookalikeCycle() {
	h := w.holder()
	if h == nil {
		return
	}
	w.rep.Faults[string(FaultLookalike)]++
	if w.objects[w.lookalike].exists {
		w.holderDelete(h, w.lookalike, w.forgeLookalike)
		return
	}
	w.forgeLookalike()
}

func (w *world) forgeLookalike() {
	h := w.holder()
	if h == nil || w.objects[w.lookalike].exists {
		return
	}
	forger := sender{caller: intruder}
	if k := w.stale(); k != nil && w.chance(0.5) {
		forger = senderOf(k)
	}
	m := forger.msg(fencing.OpCreate, bodyForged, w.lookalike, "FORGED")
	m.forgedRecord = fencing.AcceptedOf(namespace+"/"+string(h.uid), strconv.FormatInt(math.MaxInt64, 10), "", "", "")
	m.forgedClaim = fencing.Claim{Grant: "forged", Fence: strconv.FormatInt(math.MaxInt64, 10)}
	if w.chance(0.5) {
		// What the holder's next stamped write will claim, read from its
		// LockGrant.
		m.forgedClaim = senderOf(h).stamped(w.lookalike, "").claim()
		m.forgedClaim.WriteID = "" // fresh for each write: nobody can read it in advance
	}
	m.onAnswer = func(created bool, _ fencing.Reason, _ int64) {
		if !created {
			return
		}
		w.rep.Faults["lookalike-forged"]++
		hs := senderOf(h)
		claim := hs.stamped(w.lookalike, "HOLDER")
		claim.onAnswer = func(accepted bool, _ fencing.Reason, _ int64) {
			if accepted {
				w.rep.Faults["lookalike-guarded-by-holder"]++
			}
			s := forger
			if k := w.stale(); k != nil {
				s = senderOf(k)
			}
			w.send(s.msg(fencing.OpUpdate, bodyMerge, w.lookalike, "STALE"))
			w.rereadUpdate(s, w.lookalike, "", "STALE", 3)
		}
		w.send(claim)
	}
	w.send(m)
}

// holderDelete deletes target as the protocol asks: a pre-delete write that
// claims intent "delete", then a delete under the version it made; then
// runs next.
func (w *world) holderDelete(h *worker, target string, next func()) {
	s := senderOf(h)
	pre := s.stamped(target, "PRE-DELETE")
	pre.upsert, pre.intent = false, fencing.IntentDelete
	pre.onAnswer = func(accepted bool, _ fencing.Reason, rv int64) {
		if !accepted {
			return
		}
		del := s.msg(fencing.OpDelete, bodyNone, target, "")
		del.precondition = rv
		del.onAnswer = func(deleted bool, _ fencing.Reason, _ int64) {
			if !deleted {
				return
			}
			w.rep.Faults["guarded-delete-accepted"]++
			if next != nil {
				w.s.after(w.between(time.Millisecond, time.Second), next)
			}
		}
		w.send(del)
	}
	w.send(pre)
}

// subresourceWrite: the holder's status write with its claim; a status
// write without a claim; a status patch that removes the guard label,
// followed by a write without a claim; a scale; an eviction.
func (w *world) subresourceWrite() {
	w.rep.Faults[string(FaultSubresource)]++
	s := w.anySender()
	switch w.rng.IntN(5) {
	case 0:
		if h := w.holder(); h != nil {
			m := senderOf(h).stamped(w.resource, "status of "+string(h.uid))
			m.upsert, m.sub = false, "status"
			w.send(m)
		}
	case 1:
		m := s.msg(fencing.OpUpdate, bodyMerge, w.resource, "STATUS")
		m.sub = "status"
		w.send(m)
	case 2:
		m := s.msg(fencing.OpUpdate, bodyUnguard, w.resource, "")
		m.sub = "status"
		m.onAnswer = func(bool, fencing.Reason, int64) {
			w.send(s.msg(fencing.OpUpdate, bodyMerge, w.resource, "UNGUARDED"))
		}
		w.send(m)
	case 3:
		m := s.msg(fencing.OpUpdate, bodyScale, w.resource, "")
		m.sub, m.opaque = "scale", true
		w.send(m)
	default:
		m := s.msg(fencing.OpDelete, bodyNone, w.resource, "")
		m.sub, m.opaque = "eviction", true
		w.send(m)
	}
}

// deleteCycle: the holder's pre-delete write and delete; the same with a
// delete sent first by another sender at the version it read; a delete
// without a precondition; a delete under the version read, with no
// pre-delete write; a stale worker's pre-delete write and delete.
func (w *world) deleteCycle() {
	w.rep.Faults[string(FaultDelete)]++
	s := w.anySender()
	switch w.rng.IntN(5) {
	case 0:
		if h := w.holder(); h != nil {
			w.holderDelete(h, w.resource, nil)
		}
	case 1:
		if h := w.holder(); h != nil {
			hs := senderOf(h)
			pre := hs.stamped(w.resource, "PRE-DELETE")
			pre.upsert, pre.intent = false, fencing.IntentDelete
			pre.onAnswer = func(accepted bool, _ fencing.Reason, rv int64) {
				if !accepted {
					return
				}
				w.readThenDelete(s, w.resource)
				del := hs.msg(fencing.OpDelete, bodyNone, w.resource, "")
				del.precondition = rv
				w.s.after(w.between(50*time.Millisecond, 200*time.Millisecond), func() { w.deliver(del) })
			}
			w.send(pre)
		}
	case 2:
		w.send(s.msg(fencing.OpDelete, bodyNone, w.resource, ""))
	case 3:
		w.readThenDelete(s, w.resource)
	default:
		k := w.stale()
		if k == nil {
			return
		}
		ks := senderOf(k)
		pre := ks.stamped(w.resource, "PRE-DELETE")
		pre.upsert, pre.intent = false, fencing.IntentDelete
		pre.onAnswer = func(bool, fencing.Reason, int64) { w.readThenDelete(ks, w.resource) }
		w.send(pre)
	}
}
