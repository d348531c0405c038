package fencing

import (
	"fmt"
	"math"
)

// EpochBits is how many low bits of a fence count grants within one issuer
// epoch; the epoch occupies the bits above. A fence is
//
//	epoch<<EpochBits | sequence,   1 <= sequence <= MaxSequence
//
// so every fence of a later epoch is larger than every fence of an earlier
// one, and epoch 0 issues the plain sequence 1, 2, 3, ... Bumping the epoch
// is how an operator resumes after the registry was restored from an old
// snapshot: new fences jump past anything issued before, without anyone
// lowering or clearing a recorded fence. 40 bits allow about 10^12 grants
// per resource and epoch, and epochs up to 2^23-1.
//
// A fence's epoch bits are always the epoch that issued it: an epoch whose
// sequence is used up issues nothing more (NextFence refuses) rather than
// carry into the epoch bits, so a fence can never pass for one of a later
// epoch and escape the revocation of its own.
const EpochBits = 40

// MaxEpoch is the largest issuer epoch.
const MaxEpoch = 1<<(63-EpochBits) - 1

// MaxSequence is the largest sequence of one epoch: the last fence of epoch
// e is e<<EpochBits | MaxSequence. Sequence 0 is never issued.
const MaxSequence = 1<<EpochBits - 1

// EpochOf returns the issuer epoch a fence was issued in.
func EpochOf(fence int64) int64 { return fence >> EpochBits }

// SequenceOf returns a fence's sequence within its epoch.
func SequenceOf(fence int64) int64 { return fence & MaxSequence }

// NextFence returns the fence the issuer, at epoch epoch, issues after
// highest, the largest fence the resource has recorded: the next in
// sequence when highest is of epoch, else the first fence of epoch. The
// result is always larger than highest and always of epoch epoch. When no
// such fence exists it issues none and returns an *Error saying what the
// operator must do (the caller names the resource):
//
//   - ReasonSequenceExhausted: highest is the last fence of epoch (its
//     sequence is MaxSequence); a later epoch must issue. At the last
//     fence of MaxEpoch (math.MaxInt64) no epoch can: the resource takes
//     no more grants.
//   - ReasonEpochBehind: highest is of a later epoch than epoch (a counter
//     raised by hand, or an issuer restored behind its counters); the
//     issuer must be raised to EpochToIssueAbove(highest) first.
//   - ReasonInvalidSpec: epoch is outside 0..MaxEpoch, or highest is
//     negative.
func NextFence(highest, epoch int64) (int64, error) {
	switch e := EpochOf(highest); {
	case epoch < 0 || epoch > MaxEpoch:
		return 0, refuse(ReasonInvalidSpec, "issuer epoch %d is outside 0..%d", epoch, MaxEpoch)
	case highest < 0:
		return 0, refuse(ReasonInvalidSpec, "the recorded fence %d is below 0", highest)
	case e < epoch:
		return epoch<<EpochBits | 1, nil
	case e > epoch:
		return 0, refuse(ReasonEpochBehind, "the recorded fence %s is of issuer epoch %d, above the issuer's epoch %d, which cannot issue a fence above it: %s",
			FormatFence(highest), e, epoch, raiseAdvice(highest))
	case SequenceOf(highest) == MaxSequence:
		return 0, refuse(ReasonSequenceExhausted, "the sequence of issuer epoch %d is exhausted (the recorded fence %s is its last): %s",
			epoch, FormatFence(highest), raiseAdvice(highest))
	}
	return highest + 1, nil
}

// EpochToIssueAbove returns the lowest issuer epoch that can issue a fence
// above fence: fence's own epoch while its sequence has room, the next one
// when it is the last of its epoch. ok is false at the last fence of
// MaxEpoch (math.MaxInt64), above which nothing can ever be issued.
func EpochToIssueAbove(fence int64) (epoch int64, ok bool) {
	if fence == math.MaxInt64 {
		return 0, false
	}
	if fence < 0 {
		return 0, true
	}
	if SequenceOf(fence) == MaxSequence {
		return EpochOf(fence) + 1, true
	}
	return EpochOf(fence), true
}

// EpochAbove returns the lowest issuer epoch all of whose fences are above
// fence: the epoch after fence's own. It is the epoch to set when a
// resource has accepted fence and the registry lost its record (the first
// fence of that epoch is then above it). ok is false when fence is of
// MaxEpoch: no later epoch exists.
func EpochAbove(fence int64) (epoch int64, ok bool) {
	if fence < 0 {
		return 0, true
	}
	if e := EpochOf(fence); e < MaxEpoch {
		return e + 1, true
	}
	return 0, false
}

// raiseAdvice says what the operator does about a resource whose highest
// fence the current epoch cannot pass.
func raiseAdvice(highest int64) string {
	if e, ok := EpochToIssueAbove(highest); ok {
		return fmt.Sprintf("raise the FenceIssuer's spec.epoch to %d or more, which ends every Held grant of an earlier epoch (docs/runbook.md, \"Grants held back\")", e)
	}
	return "it is the last fence there is (2^63-1), so the resource can take no more grants: use another resource ID (docs/runbook.md, \"Grants held back\")"
}

// NextFenceAbove is NextFence with a floor: floor is the highest fence the
// resource is known to have accepted outside its counter (a guarded
// object's record, found after a reinstall or a restore of the registry
// from an old snapshot left the counter behind it); 0 when none is known.
// It returns NextFence(highest, epoch) when that is above floor, and
// never a fence at or below floor: then it issues none and returns an
// *Error with ReasonFenceRegression that names the issuer epoch to raise to,
// EpochAbove(floor), whose fences are all above anything of floor's epoch
// (the counter lost its record, so fences of floor's epoch above floor may
// have been issued too). A floor of MaxEpoch has no epoch above it: the
// refusal points to the runbook's way out for a wedged object. NextFence's
// own refusals come first.
func NextFenceAbove(highest, floor, epoch int64) (int64, error) {
	next, err := NextFence(highest, epoch)
	if err != nil || next > floor {
		return next, err
	}
	advice := "it is of the last issuer epoch, above which none can be raised: retire the object that recorded it (docs/runbook.md, \"An object wedged in the last epoch\") or use another resource ID"
	if e, ok := EpochAbove(floor); ok {
		advice = fmt.Sprintf("raise the FenceIssuer's spec.epoch to %d or more, which ends every Held grant of an earlier epoch (docs/runbook.md, \"LockwardenFenceRegression\")", e)
	}
	return 0, refuse(ReasonFenceRegression, "the next fence, %s, would not be above fence %s that a guarded object recorded for the resource: the registry lost fences (a reinstall, or a restore from an old snapshot); %s",
		FormatFence(next), FormatFence(floor), advice)
}
