package sim

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// segKey names one segment of one operation.
type segKey struct {
	root string
	seq  int64
}

// store is a PostgreSQL-like segment store: ledger, receipts and effects in
// one transaction, outside the registry (a restore does not touch it).
type store struct {
	resource    string
	ledger      fencing.Ledger
	receipts    map[segKey]fencing.Receipt
	rootLast    map[string]int64
	effects     map[segKey]int
	quarantined int
	// grantOf is the grant of every fence the store accepted (oracle only).
	grantOf map[int64]types.UID
	// maxApplied is the oracle's view of the last applied sequence per root.
	maxApplied map[string]int64
	receiptN   int
}

func newStore(resource string) *store {
	return &store{resource: resource, receipts: map[segKey]fencing.Receipt{}, rootLast: map[string]int64{},
		effects: map[segKey]int{}, grantOf: map[int64]types.UID{}, maxApplied: map[string]int64{}}
}

// segMsg is a segment in flight.
type segMsg struct {
	caller   string
	seg      fencing.Segment
	payload  string
	injected string
	// ackLost drops the store's answer: the sender learns nothing.
	ackLost  bool
	onAnswer func(applied bool, reason fencing.Reason)
}

// deliverSegment is the segment store: in one transaction, with the ledger
// row locked, gather the registry's facts and CheckSegment, then apply.
func (w *world) deliverSegment(m segMsg) {
	now := w.s.now
	st := w.stores[w.resource]
	w.rep.Offered++
	g, c := w.reg.facts(types.UID(m.seg.GrantUID), st.resource)
	key := segKey{m.seg.Root, m.seg.Seq}
	var prior *fencing.Receipt
	if r, ok := st.receipts[key]; ok {
		prior = &r
	}
	beforeLedger := st.ledger
	d, err := fencing.CheckSegment(fencing.SegmentWrite{
		Resource: st.resource, Caller: m.caller, Segment: m.seg, Grant: g, Counter: c, Now: w.reg.wall(now),
		Ledger: st.ledger, Prior: prior, RootLastSeq: st.rootLast[m.seg.Root],
	})
	answer := func(applied bool, r fencing.Reason) {
		if m.onAnswer != nil && !m.ackLost {
			w.s.after(w.netDelay(), func() { m.onAnswer(applied, r) })
		}
	}
	if err != nil {
		reason := fencing.ReasonOf(err)
		w.rep.Rejected[string(reason)]++
		if reason == fencing.ReasonSegmentConflict {
			st.quarantined++
		}
		if authReasons[reason] && st.ledger != beforeLedger {
			w.rep.AuthFailMovedFence++
			w.rep.violate("seed %d: refused %s moved the ledger of %s", w.seed, reason, st.resource)
		}
		answer(false, reason)
		return
	}
	if d.Next.Fence < st.ledger.Fence {
		w.rep.violate("seed %d: a decision lowers the ledger from %d to %d", w.seed, st.ledger.Fence, d.Next.Fence)
		w.rep.RegressionAccepted++
	}
	if d.Verdict == fencing.VerdictApply {
		w.rep.Accepted++
		w.rep.AcceptedChecked++
		w.judge("segment", st.resource, types.UID(m.seg.GrantUID), m.seg.Fence, m.injected, w.h.issued[st.resource], st.ledger.Fence, st.grantOf[st.ledger.Fence], false, now)
		if want := st.maxApplied[m.seg.Root] + 1; m.seg.Seq != want {
			w.rep.GapAccepted++
			w.rep.violate("seed %d: segment %d of %s applied, expected %d", w.seed, m.seg.Seq, m.seg.Root, want)
		}
		st.effects[key]++
		if st.effects[key] > 1 {
			w.rep.DoubleEffect++
			w.rep.violate("seed %d: segment %d of %s applied twice", w.seed, m.seg.Seq, m.seg.Root)
		}
		st.maxApplied[m.seg.Root] = max(st.maxApplied[m.seg.Root], m.seg.Seq)
		st.receiptN++
		st.receipts[key] = fencing.Receipt{ID: string(rune('a' + st.receiptN%26)), Resource: st.resource, Fence: m.seg.Fence,
			GrantUID: m.seg.GrantUID, Root: m.seg.Root, Seq: m.seg.Seq, Digest: m.seg.Digest, AcceptedAt: w.reg.wall(now)}
		st.rootLast[m.seg.Root] = max(st.rootLast[m.seg.Root], m.seg.Seq)
	}
	st.grantOf[d.Next.Fence] = types.UID(d.Next.GrantUID)
	st.ledger = d.Next
	answer(d.Verdict == fencing.VerdictApply || d.Verdict == fencing.VerdictDuplicate, "")
}

// judge checks one accepted mutation against the history, independently of
// the verifier: it must come from a grant the registry really issued and
// that was live at that instant, with a fence no older than any issued or
// accepted before, and never re-use an accepted fence from another grant.
//
// issued is the highest fence issued for the resource as far as the written
// place can know: the true history for a store outside the registry, the
// rolled-back one for objects that live in the registry's own etcd.
//
// lagged says the mutation was accepted by admission from a replica's cache
// in the window that adds (inAdmissionLag): then a fence below the highest
// issued, or a grant that has ended, is counted as accepted-in-admission-lag
// instead of forbidden. A fence below the highest the resource accepted
// stays forbidden, and so does a lease that ran out (the cache's lease end
// bounds the window, and it is never later than the history's).
func (w *world) judge(kind, resource string, uid types.UID, fence int64, injected string, issued, highest int64, highestBy types.UID, lagged bool, now time.Duration) {
	if injected != "" {
		w.rep.ForgedAccepted++
		w.rep.violate("seed %d: %s %s accepted (fence %d)", w.seed, injected, kind, fence)
	}
	if fence >= highest && w.inRestoreWindow() && (fence < issued || (w.resurrected[uid] && !w.h.liveAt(uid, now))) {
		// The restored registry and the resource both lack the newer fence
		// (it never reached the resource): nothing here can tell. Counted
		// apart; closed by the epoch bump.
		w.rep.Faults["accepted-in-restore-window"]++
		return
	}
	if lagged && fence >= highest && (fence < issued || !w.h.liveAt(uid, now)) {
		w.rep.Faults[admissionLagFault]++
		return
	}
	if fence < issued || fence < highest {
		w.rep.StaleAccepted++
		w.rep.violate("seed %d: %s with fence %d accepted at %s; issued %d, accepted %d", w.seed, kind, fence, now, issued, highest)
	}
	if fence == highest && highestBy != "" && highestBy != uid {
		w.rep.RegressionAccepted++
		w.rep.violate("seed %d: %s with fence %d of %s accepted; the resource took fence %d from %s", w.seed, kind, fence, uid, highest, highestBy)
	}
	if !w.h.liveAt(uid, now) {
		w.rep.ExpiredOwnerAccepted++
		w.rep.violate("seed %d: %s by %s accepted at %s after its grant ended or expired", w.seed, kind, uid, now)
	}
}
