package sim

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// worker is one holder process: it acquires the resource, writes an
// operation as segments and then its object, renews, releases, and starts
// over, driving a real holder.Machine on its own monotonic clock.
type worker struct {
	w    *world
	name string
	// id tells the worker apart from replicas that share its name.
	id int
	// rate is how fast this process's monotonic clock runs against the
	// registry's (clocks differ in rate; only durations are compared).
	rate float64

	m        *holder.Machine
	uid      types.UID
	acqN     int
	inFlight bool // an acquire is in flight
	lastRV   string
	fence    int64
	proof    fencing.Proof
	// frozenUntil is when a pause ends.
	frozenUntil time.Duration

	root     string
	nextSeq  int64
	segTotal int64
	segBusy  bool
	wrote    bool

	unknownSince time.Duration
	inUnknown    bool
}

func newWorker(w *world, name string, id int) *worker {
	return &worker{w: w, name: name, id: id, rate: 0.7 + 0.8*w.rng.Float64()}
}

func (k *worker) mono() holder.Mono { return holder.Mono(float64(k.w.s.now) * k.rate) }

func (k *worker) frozen() bool { return k.w.s.now < k.frozenUntil }

// later runs fn after d, or once a pause is over.
func (k *worker) later(d time.Duration, fn func()) {
	k.w.s.at(max(k.w.s.now+d, k.frozenUntil), fn)
}

// step is the worker's main loop.
func (k *worker) step() {
	w := k.w
	if k.frozen() {
		k.later(0, k.step)
		return
	}
	defer k.later(w.between(50*time.Millisecond, 300*time.Millisecond), k.step)
	if k.m == nil || k.m.State().Final() {
		if !k.inFlight && k.acqN < 4 {
			k.acquire()
		}
		return
	}
	now := k.mono()
	if k.m.Tick(now) == holder.OwnershipUnknown {
		k.trackUnknown(holder.OwnershipUnknown)
		k.read() // reconcile by reading the grant; never assume
		return
	}
	k.trackUnknown(k.m.State())
	if due, ok := k.m.NextRenew(now); ok && due <= now {
		if target, ok := k.m.RenewSent(now); ok {
			k.renew(target)
		}
	}
	if !k.m.Valid(now) || k.m.Releasing() || k.segBusy {
		return
	}
	switch {
	case k.nextSeq <= k.segTotal:
		k.sendSegment()
	case !k.wrote:
		k.writeObject()
	default:
		k.release()
	}
}

func (k *worker) trackUnknown(s holder.State) {
	w := k.w
	switch {
	case s == holder.OwnershipUnknown && !k.inUnknown:
		k.inUnknown, k.unknownSince = true, w.s.now
	case s != holder.OwnershipUnknown && k.inUnknown:
		k.inUnknown = false
		k.endUnknown()
	}
}

func (k *worker) endUnknown() {
	w := k.w
	d := w.s.now - k.unknownSince
	w.rep.MaxUnknown = max(w.rep.MaxUnknown, d)
	if d > 15*time.Minute {
		w.rep.UnknownNotReconciled++
		w.rep.violate("seed %d: %s stayed OWNERSHIP_UNKNOWN for %s", w.seed, k.name, d)
	}
}

// finish closes the worker's books at the horizon.
func (k *worker) finish() {
	if k.inUnknown {
		k.endUnknown()
	}
}

// acquire creates a LockGrant; a lost response is recovered by request ID.
func (k *worker) acquire() {
	w := k.w
	k.acqN++
	k.inFlight = true
	reqID := fmt.Sprintf("worker-%d-%d", k.id, k.acqN)
	ttl := int32(2 + w.rng.IntN(9))
	m, err := holder.New(holder.Config{TTL: time.Duration(ttl) * time.Second})
	if err != nil {
		panic(err)
	}
	sentAt := k.mono()
	var created *grantRef
	w.s.after(w.netDelay(), func() {
		g := w.reg.create(k.name, w.resource, ttl, reqID, w.s.now)
		created = &grantRef{uid: g.UID}
		w.kick(w.resource)
		lost := w.chance(0.05)
		k.later(w.netDelay(), func() {
			if lost {
				return // recovered below, by request ID
			}
			k.adopt(m, created.uid, sentAt)
		})
	})
	// The client's own timeout: look the grant up by request ID.
	k.later(time.Second, func() {
		if k.m == m || created == nil {
			return
		}
		if uid, ok := w.reg.byReq[reqID]; ok {
			w.rep.Faults["lost-acquire-response"]++
			k.adopt(m, uid, sentAt)
		}
	})
}

type grantRef struct{ uid types.UID }

func (k *worker) adopt(m *holder.Machine, uid types.UID, sentAt holder.Mono) {
	if k.m == m {
		return
	}
	m.Created(sentAt)
	k.m, k.uid, k.inFlight, k.lastRV = m, uid, false, ""
	k.fence, k.proof, k.wrote, k.segBusy = 0, "", false, false
	k.startOperation()
	k.notify()
}

// startOperation picks the operation this acquisition writes: a new one, or
// the retry of an operation an earlier holder left unfinished.
func (k *worker) startOperation() {
	w := k.w
	st := w.stores[w.resource]
	k.nextSeq, k.segTotal = 1, int64(2+w.rng.IntN(4))
	if st.ledger.Root != "" && st.rootLast[st.ledger.Root] < 6 && w.chance(0.3) {
		k.root = st.ledger.Root // same payloads: resends get receipts, no second effect
		k.segTotal = 6
		return
	}
	k.root = fmt.Sprintf("op-%s-%d", k.uid, k.acqN)
}

// notify delivers the grant's current state, as a watch does.
func (k *worker) notify() {
	w := k.w
	if k.uid == "" {
		return
	}
	g := w.reg.grants[k.uid]
	rv := "gone"
	if g != nil {
		rv = string(g.UID) + string(g.Status.Phase) + fmt.Sprint(g.Status.ObservedRenewals, g.Status.FenceToken)
	}
	if rv == k.lastRV {
		return
	}
	k.lastRV = rv
	f := holder.FactsOf(nil)
	proof := fencing.Proof("")
	if g != nil {
		f = holder.FactsOf(g.DeepCopy())
		proof = fencing.Proof(g.Status.Proof)
	}
	m, uid := k.m, k.uid
	k.later(w.between(time.Millisecond, 60*time.Millisecond), func() {
		if k.m != m || k.uid != uid {
			return
		}
		k.trackUnknown(m.Observe(k.mono(), f))
		if f.Fence > 0 {
			k.fence, k.proof = f.Fence, proof
		}
	})
}

// read GETs the grant directly (a linearizable read) and applies it.
func (k *worker) read() {
	w := k.w
	m, uid := k.m, k.uid
	w.s.after(w.netDelay(), func() {
		f := holder.FactsOf(nil)
		var proof fencing.Proof
		if g := w.reg.grants[uid]; g != nil {
			f, proof = holder.FactsOf(g.DeepCopy()), fencing.Proof(g.Status.Proof)
		}
		k.later(w.netDelay(), func() {
			if k.m != m {
				return
			}
			k.trackUnknown(m.Observe(k.mono(), f))
			if f.Fence > 0 {
				k.fence, k.proof = f.Fence, proof
			}
		})
	})
}

func (k *worker) renew(target int64) {
	w := k.w
	m, uid := k.m, k.uid
	w.s.after(w.netDelay(), func() {
		err := w.reg.renew(uid, k.name, target, w.s.now)
		w.kick(w.resource)
		if w.fault[FaultLostRenew] && w.chance(0.5) {
			w.rep.Faults[string(FaultLostRenew)]++
			return // the holder must learn the outcome by reading the grant
		}
		k.later(w.netDelay(), func() {
			if err != nil && k.m == m {
				k.trackUnknown(m.Refused(k.mono(), fencing.ReasonOf(err)))
			}
		})
	})
}

func (k *worker) release() {
	w := k.w
	m, uid := k.m, k.uid
	m.ReleaseSent(k.mono())
	w.inFlightAtRelease(k)
	w.s.after(w.netDelay(), func() {
		err := w.reg.release(uid, k.name, w.s.now)
		w.kick(w.resource)
		if w.fault[FaultReleaseReacquire] && w.chance(0.5) {
			// The reply is lost; the owner acquires again at once and
			// retries the release of the earlier grant later.
			w.rep.Faults[string(FaultReleaseReacquire)]++
			k.later(0, func() {
				if k.m == m {
					m.ReleaseAccepted(k.mono())
				}
			})
			released := w.s.now
			k.later(w.between(500*time.Millisecond, 3*time.Second), func() {
				err := w.reg.release(uid, k.name, w.s.now)
				switch {
				case err != nil:
				case w.restoredAt > released:
					// The restore rolled the release back; the retry is
					// the first release the registry knows.
					w.rep.Faults["release-forgotten-by-restore"]++
				default:
					w.rep.violate("seed %d: a retried release of an ended grant was accepted", w.seed)
					w.rep.ExpiredOwnerAccepted++
				}
			})
			return
		}
		k.later(w.netDelay(), func() {
			if k.m != m {
				return
			}
			if err != nil {
				m.Refused(k.mono(), fencing.ReasonOf(err))
				return
			}
			m.ReleaseAccepted(k.mono())
		})
	})
}

func payload(root string, seq int64) string { return fmt.Sprintf("%s#%d", root, seq) }

// sendSegment sends the next segment of the operation, with the faults of
// the round: a pause between the check and the send, disorder, a lost ack.
func (k *worker) sendSegment() {
	w := k.w
	seg := fencing.Segment{Fence: k.fence, GrantUID: string(k.uid), Root: k.root, Seq: k.nextSeq,
		Digest: fencing.PayloadDigest([]byte(payload(k.root, k.nextSeq)))}
	k.segBusy = true
	m := k.m
	msg := segMsg{caller: k.name, seg: seg, payload: payload(k.root, seg.Seq)}
	msg.onAnswer = func(applied bool, reason fencing.Reason) {
		if k.m != m {
			return
		}
		k.segBusy = false
		switch {
		case applied && k.nextSeq == seg.Seq:
			k.nextSeq++
		case reason == fencing.ReasonSequenceGap:
			k.resync()
		case !applied:
			k.segTotal = 0 // fenced out or refused: stop producing effects
			k.wrote = true
		}
	}
	if w.fault[FaultLostAck] && w.chance(0.2) {
		msg.ackLost = true
		w.rep.Faults[string(FaultLostAck)]++
		k.later(time.Second, func() { k.resolveUnknown(m, seg) })
	}
	if w.fault[FaultSegmentDisorder] && w.chance(0.25) {
		k.disorder(seg)
	}
	k.send(func() { w.deliverSegment(msg) })
}

// send delivers fn after a network hop, with the round's pause and
// late-delivery faults.
func (k *worker) send(deliver func()) {
	w := k.w
	d := w.netDelay()
	if w.fault[FaultPause] && w.chance(0.15) {
		// The check passed; the process freezes before the send, past its TTL.
		pause := time.Duration(float64(k.m.Config().TTL) * (1.2 + 2*w.rng.Float64()))
		k.frozenUntil = w.s.now + pause
		d += pause
		w.rep.Faults[string(FaultPause)]++
	}
	if w.fault[FaultLateMessage] && w.chance(0.1) {
		d += w.between(5*time.Second, 40*time.Second)
		w.rep.Faults[string(FaultLateMessage)]++
	}
	w.s.after(d, deliver)
}

// disorder sends copies the store must refuse or answer idempotently: the
// next segment before this one, a duplicate, and this one with another payload.
func (k *worker) disorder(seg fencing.Segment) {
	w := k.w
	w.rep.Faults[string(FaultSegmentDisorder)]++
	ahead := seg
	ahead.Seq++
	ahead.Digest = fencing.PayloadDigest([]byte(payload(k.root, ahead.Seq)))
	w.s.after(w.between(0, 5*time.Millisecond), func() { w.deliverSegment(segMsg{caller: k.name, seg: ahead}) })
	w.s.after(w.between(50*time.Millisecond, 500*time.Millisecond), func() { w.deliverSegment(segMsg{caller: k.name, seg: seg}) })
	other := seg
	other.Digest = fencing.PayloadDigest([]byte("other payload"))
	w.s.after(w.between(50*time.Millisecond, 500*time.Millisecond), func() { w.deliverSegment(segMsg{caller: k.name, seg: other}) })
}

// resync continues after a SEQUENCE_GAP from where the store stands.
func (k *worker) resync() {
	st := k.w.stores[k.w.resource]
	if st.ledger.Root == k.root && st.ledger.GrantUID == string(k.uid) {
		k.nextSeq = st.ledger.LastSeq + 1
		return
	}
	k.segTotal = 0
}

// resolveUnknown handles MUTATION_UNKNOWN: look up the receipt.
func (k *worker) resolveUnknown(m *holder.Machine, seg fencing.Segment) {
	w := k.w
	if k.m != m {
		return
	}
	st := w.stores[w.resource]
	var receipt *fencing.Receipt
	if r, ok := st.receipts[segKey{seg.Root, seg.Seq}]; ok {
		receipt = &r
	}
	switch fencing.ResolveMutation(st.ledger, receipt, seg.Fence) {
	case fencing.MutationApplied:
		w.rep.Faults["mutation-unknown-applied"]++
		k.segBusy = false
		if k.nextSeq == seg.Seq {
			k.nextSeq++
		}
	case fencing.MutationAbsent:
		w.rep.Faults["mutation-unknown-absent"]++
		k.segBusy, k.segTotal, k.wrote = false, 0, true
	default:
		// Still possible: resend the same payload, which is idempotent.
		w.rep.Faults["mutation-unknown-resend"]++
		k.segBusy = false
	}
}

// writeObject applies the guarded object stamped with the grant's claim and
// proof, as pkg/lock's Stamp does; it creates the object if it is gone.
func (k *worker) writeObject() {
	w := k.w
	k.wrote = true
	msg := k.stamped(w.resource, string(k.uid))
	k.send(func() { w.deliver(msg) })
}

// stamped is an apply of object target that asserts the worker's own claim.
func (k *worker) stamped(target, data string) writeMsg {
	return writeMsg{op: fencing.OpUpdate, upsert: true, body: bodyStamped, caller: k.name, target: target, data: data,
		uid: k.uid, fence: k.fence, proof: k.proof, writeID: newWriteID()}
}
