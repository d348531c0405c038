package fencing

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Segment is one step of a multi-segment operation, as it reaches the
// resource. A long operation (a settlement batch, a migration) is cut into
// segments that share one operation root and carry strictly increasing
// sequence numbers from 1; every segment is checked and recorded on its own,
// so a holder that loses its lease half-way leaves a well-defined prefix
// behind.
type Segment struct {
	// Fence is the fencing token of the grant the segment is written under.
	Fence int64
	// GrantUID is the UID of that grant (the LockGrant UID, the record's
	// leaseID): the per-acquisition owner token.
	GrantUID string
	// Root is the operation root: the stable ID of the whole operation,
	// shared by all its segments and by every retry of it, for example
	// "sha256:<64 hex>" of the batch.
	Root string
	// Seq is the segment's position in the operation, from 1.
	Seq int64
	// Digest identifies the segment's payload (see PayloadDigest): the same
	// segment sent again with the same digest is a resend, with another
	// digest a conflict.
	Digest string
}

// Receipt is the resource's record of one accepted segment. Exactly one
// receipt exists per resource, operation root and sequence; it is written in
// the same transaction as the segment's effect.
type Receipt struct {
	// ID is the store's unique name of the receipt.
	ID string
	// Resource is the resource ID.
	Resource string
	// Fence, GrantUID, Root, Seq and Digest are the accepted segment's.
	Fence    int64
	GrantUID string
	Root     string
	Seq      int64
	Digest   string
	// AcceptedAt is when the store accepted it, by the store's clock.
	AcceptedAt time.Time
}

// Ledger is a resource's segment record: the highest fence the resource has
// accepted and where the operation under it stands. It is kept in the same
// transaction as every accepted segment, and never lowered.
type Ledger struct {
	// Fence is the highest fence accepted; 0 before the first segment.
	Fence int64
	// GrantUID is the grant of Fence.
	GrantUID string
	// Root is the operation root of Fence.
	Root string
	// LastSeq is the last sequence accepted under Fence and Root.
	LastSeq int64
}

// SegmentWrite is everything CheckSegment needs to decide on one segment,
// gathered by the enforcement point inside the transaction that will apply
// it, with the resource's ledger row locked.
type SegmentWrite struct {
	// Resource is the resource ID the segment is written to.
	Resource string
	// Caller is the identity making the write.
	Caller string
	// Segment is the incoming segment.
	Segment Segment
	// Grant is the grant Segment.GrantUID names, read linearizably from the
	// registry; nil when the registry has no such grant.
	Grant *Grant
	// Counter is the resource's fence record in the registry; nil when none.
	Counter *Counter
	// Now is the enforcement point's clock.
	Now time.Time
	// Ledger is the resource's current segment record.
	Ledger Ledger
	// Prior is the resource's receipt for Segment.Root and Segment.Seq, nil
	// when there is none.
	Prior *Receipt
	// RootLastSeq is the highest sequence the resource has accepted for
	// Segment.Root under any fence; 0 when none.
	RootLastSeq int64
}

// Verdict is what an enforcement point does with a segment CheckSegment did
// not refuse.
type Verdict int

const (
	// VerdictApply says to apply the segment's effect, write its receipt and store
	// the decision's Next ledger, all in one transaction.
	VerdictApply Verdict = iota + 1
	// VerdictDuplicate says the segment was already accepted with this payload.
	// Return the original receipt and apply nothing; store Next, which may
	// have moved to a newer fence that resent segment 1 of its operation.
	VerdictDuplicate
)

// String returns "Apply" or "Duplicate".
func (v Verdict) String() string {
	switch v {
	case VerdictApply:
		return "Apply"
	case VerdictDuplicate:
		return "Duplicate"
	}
	return "Verdict(?)"
}

// SegmentDecision is CheckSegment's answer for an admitted segment.
type SegmentDecision struct {
	// Verdict says whether to apply the segment or return Receipt.
	Verdict Verdict
	// Next is the ledger to store. Next.Fence is never below the current
	// ledger's fence.
	Next Ledger
	// Receipt is the original receipt of a duplicate; nil for VerdictApply.
	Receipt *Receipt
}

// CheckSegment decides on one segment of a multi-segment operation. It
// authenticates the grant with CheckWrite's rules, then applies the segment
// rules against the resource's ledger. It returns a decision, or an *Error
// for the first rule the segment breaks, in this order:
//
//  1. ReasonNoFence / ReasonInvalidSegment: a fence below 1, or no grant
//     UID, root or digest, or a sequence below 1.
//  2. ReasonBindingMismatch: the registry's grant is not the one the segment
//     names; then CheckWrite's authentication rules, judged on the
//     registry's facts alone: ReasonUnknownGrant, ReasonBindingMismatch,
//     ReasonNotOwner. An unauthenticated segment never reaches the ledger.
//  3. ReasonFenceRegression: the fence equals the ledger's but comes from
//     another grant or another operation root; or the fence is not larger
//     than the ledger's although the registry reports its grant as the
//     resource's current Held grant. Both mean the registry issued a fence
//     again (a coordinator restored from an old snapshot). Refused, and the
//     ledger is never lowered to let the traffic through.
//  4. ReasonStaleOwner: the fence is below the ledger's (a newer owner has
//     written), then CheckWrite's remaining rules (stale against the
//     registry, ReasonExpired, ReasonNotHeld, ReasonAlreadyEnded,
//     ReasonRevoked).
//  5. ReasonSegmentConflict: the segment was already accepted (Prior) with
//     another digest. Quarantine it; never apply it.
//  6. Under the ledger's own fence, grant and root: a resend of an accepted
//     segment is VerdictDuplicate; otherwise only sequence LastSeq+1 is
//     VerdictApply, anything else ReasonSequenceGap.
//  7. A fence larger than the ledger's: only segment 1 of the segment's
//     root, else ReasonSequenceGap. New: VerdictApply, and the ledger moves
//     to the new fence. Already accepted (a retry of the operation by a new
//     owner): VerdictDuplicate, and the ledger moves to the new fence
//     with LastSeq = RootLastSeq, so the new owner continues where the
//     operation stands.
//
// A fence once in the ledger is only ever replaced by a larger one, so the
// sequence of fences a resource accepts never decreases, and a segment has
// at most one effect: VerdictApply is returned only when Prior is nil.
//
// This is Kleppmann's fencing token (2016) and Chubby's sequencer (Burrows,
// 2006) applied per segment, with a receipt per segment so that a retry can
// tell a lost acknowledgement from a lost write. CheckSegment changes
// nothing; the enforcement point stores the decision atomically with the
// effect.
func CheckSegment(w SegmentWrite) (SegmentDecision, error) {
	s, l := w.Segment, w.Ledger
	if s.Fence < 1 {
		return SegmentDecision{}, refuse(ReasonNoFence, "the segment carries no fence")
	}
	switch {
	case s.GrantUID == "":
		return SegmentDecision{}, refuse(ReasonInvalidSegment, "the segment names no grant")
	case s.Root == "":
		return SegmentDecision{}, refuse(ReasonInvalidSegment, "the segment names no operation root")
	case s.Seq < 1:
		return SegmentDecision{}, refuse(ReasonInvalidSegment, "segment sequence %d is below 1", s.Seq)
	case s.Digest == "":
		return SegmentDecision{}, refuse(ReasonInvalidSegment, "the segment carries no payload digest")
	}
	if w.Grant != nil && w.Grant.UID != s.GrantUID {
		return SegmentDecision{}, refuse(ReasonBindingMismatch, "the registry's grant %q is not the segment's grant %q", w.Grant.UID, s.GrantUID)
	}

	// Authenticate on the registry's facts alone. A nil result also means
	// the registry names this grant as the resource's current Held grant.
	write := Write{Resource: w.Resource, Caller: w.Caller, Fence: s.Fence, Grant: w.Grant, Counter: w.Counter, Now: w.Now}
	registryErr := CheckWrite(write)
	if !authentic(registryErr) {
		return SegmentDecision{}, registryErr
	}
	current := registryErr == nil

	switch {
	case s.Fence == l.Fence && s.GrantUID != l.GrantUID:
		return SegmentDecision{}, refuse(ReasonFenceRegression, "fence %d was accepted from grant %q; grant %q presents it again: the registry issued a fence twice", s.Fence, l.GrantUID, s.GrantUID)
	case s.Fence == l.Fence && s.Root != l.Root:
		return SegmentDecision{}, refuse(ReasonFenceRegression, "fence %d was accepted for operation %q; it is presented again for operation %q", s.Fence, l.Root, s.Root)
	case s.Fence < l.Fence && current:
		return SegmentDecision{}, refuse(ReasonFenceRegression, "the registry names the grant of fence %d as the holder of resource %q, which has accepted fence %d: the registry went back in time", s.Fence, w.Resource, l.Fence)
	}

	// The ledger's fence counts as recorded: a smaller fence is STALE_OWNER
	// before any liveness rule.
	write.Recorded = l.Fence
	if err := CheckWrite(write); err != nil {
		return SegmentDecision{}, err
	}

	if p := w.Prior; p != nil {
		if p.Digest != s.Digest {
			return SegmentDecision{}, refuse(ReasonSegmentConflict, "segment %d of operation %q was accepted with payload %s; a different payload %s is quarantined", s.Seq, s.Root, p.Digest, s.Digest)
		}
		if s.Fence == l.Fence {
			return SegmentDecision{Verdict: VerdictDuplicate, Next: l, Receipt: p}, nil
		}
	}
	if s.Fence == l.Fence {
		if s.Seq != l.LastSeq+1 {
			return SegmentDecision{}, refuse(ReasonSequenceGap, "operation %q expects segment %d under fence %d, got %d", s.Root, l.LastSeq+1, s.Fence, s.Seq)
		}
		next := l
		next.LastSeq = s.Seq
		return SegmentDecision{Verdict: VerdictApply, Next: next}, nil
	}

	// A larger fence takes over the resource, with segment 1 of its operation.
	if s.Seq != 1 {
		return SegmentDecision{}, refuse(ReasonSequenceGap, "fence %d is new to resource %q and must begin with segment 1 of operation %q, got %d", s.Fence, w.Resource, s.Root, s.Seq)
	}
	next := Ledger{Fence: s.Fence, GrantUID: s.GrantUID, Root: s.Root, LastSeq: 1}
	if w.Prior != nil {
		next.LastSeq = max(w.RootLastSeq, 1)
		return SegmentDecision{Verdict: VerdictDuplicate, Next: next, Receipt: w.Prior}, nil
	}
	return SegmentDecision{Verdict: VerdictApply, Next: next}, nil
}

// authentic reports whether CheckWrite's judgement on the registry's facts
// alone established a real grant of this caller for this resource and fence
// (it may still be superseded or over). A reason not listed here counts as
// not authentic, so a reason added to CheckWrite later is still a refusal;
// it only skips the ledger's more specific STALE_OWNER and FENCE_REGRESSION.
func authentic(err error) bool {
	if err == nil {
		return true
	}
	switch ReasonOf(err) {
	case ReasonStaleOwner, ReasonExpired, ReasonNotHeld, ReasonAlreadyEnded, ReasonRevoked:
		return true
	}
	return false
}

// PayloadDigest returns the digest of a segment payload as
// "sha256:<64 lowercase hex>". Callers give the segment's canonical bytes, so
// that the same content always has the same digest.
func PayloadDigest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// MutationState is what a lookup by operation root and sequence proves
// about a write whose outcome the caller does not know (MUTATION_UNKNOWN).
type MutationState int

const (
	// MutationUnknown means there is no receipt, but the write could still be accepted
	// later (its fence is still the resource's highest). Do not redo it:
	// either let a newer fence write first (which fences the attempt out)
	// and look again, or report the operation for reconciliation.
	MutationUnknown MutationState = iota
	// MutationApplied means the resource holds a receipt; reuse it, do not redo.
	MutationApplied
	// MutationAbsent means there is no receipt, and the resource has accepted a fence
	// above the attempt's, so the attempt can never be accepted: a newer
	// fence may redo the segment.
	MutationAbsent
)

// String returns "Unknown", "Applied" or "Absent".
func (m MutationState) String() string {
	switch m {
	case MutationApplied:
		return "Applied"
	case MutationAbsent:
		return "Absent"
	}
	return "Unknown"
}

// ResolveMutation classifies an attempt made with attemptFence, given the
// resource's ledger and its receipt for the attempted root and sequence
// (nil when none), both read after every earlier write to the resource has
// committed or aborted (with the ledger row locked). Found is applied; not
// found is proven absent only when the ledger's fence is above
// attemptFence, since until then a delayed copy of the attempt could still
// arrive and be accepted.
func ResolveMutation(l Ledger, receipt *Receipt, attemptFence int64) MutationState {
	switch {
	case receipt != nil:
		return MutationApplied
	case l.Fence > attemptFence:
		return MutationAbsent
	}
	return MutationUnknown
}
