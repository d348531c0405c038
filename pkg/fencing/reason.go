package fencing

import (
	"errors"
	"fmt"
	"strings"
)

// Reason is the machine-readable code of a refusal. The same codes appear in
// admission denials, LockGrant conditions, Events and metrics.
type Reason string

const (
	// ReasonNoFence means the write carries no grant reference or fence, or a
	// malformed one.
	ReasonNoFence Reason = "NO_FENCE"
	// ReasonNoResource means a guarded object does not name a valid resource ID.
	ReasonNoResource Reason = "NO_RESOURCE"
	// ReasonUnknownGrant means the registry has no such grant, or no record of the
	// resource.
	ReasonUnknownGrant Reason = "UNKNOWN_GRANT"
	// ReasonBindingMismatch means the grant is for another resource, or the fence
	// presented is not the one the grant was issued.
	ReasonBindingMismatch Reason = "BINDING_MISMATCH"
	// ReasonNotOwner means the caller is not the grant's owner.
	ReasonNotOwner Reason = "NOT_OWNER"
	// ReasonStaleOwner means a newer fence has been issued for the resource or
	// accepted by the object; the grant is superseded.
	ReasonStaleOwner Reason = "STALE_OWNER"
	// ReasonExpired means the grant's lease is over (at expiresAt, equality
	// included) and no newer grant superseded it yet.
	ReasonExpired Reason = "EXPIRED"
	// ReasonNotHeld means the grant is still waiting in the queue.
	ReasonNotHeld Reason = "NOT_HELD"
	// ReasonAlreadyEnded means the grant was already released or its wait
	// timed out. The holder library says which when it knows
	// (ReasonReleased, ReasonTimedOut); their errors match ErrAlreadyEnded
	// too.
	ReasonAlreadyEnded Reason = "ALREADY_ENDED"
	// ReasonFenceRegression means the registry issued a fence the resource had
	// already seen from another grant or operation (a restore from an old
	// snapshot), or a write would lower a recorded fence.
	ReasonFenceRegression Reason = "FENCE_REGRESSION"
	// ReasonRevoked means the issuer ended the grant before its lease ran out
	// (its epoch was revoked or superseded, or its policy stopped allowing it).
	ReasonRevoked Reason = "REVOKED"
	// ReasonFenceNotIssued means the write carries a fence no issuer ever
	// issued to its grant: sequence 0 of an epoch, or a value that is not
	// the grant's fence but equals it as a floating-point number (a JSON
	// tool such as jq rounded it: integers above 2^53 do not survive a
	// float64). Copy fences as text.
	ReasonFenceNotIssued Reason = "FENCE_NOT_ISSUED"

	// Issuing (NextFence): why a waiting request is held back.

	// ReasonSequenceExhausted means the resource's fences of the current
	// issuer epoch are used up (its recorded fence is the epoch's last): it
	// is granted again only once the issuer's epoch is raised, never with a
	// fence that carries into the epoch bits.
	ReasonSequenceExhausted Reason = "SEQUENCE_EXHAUSTED"
	// ReasonEpochBehind means the resource has recorded a fence of a later
	// issuer epoch than the issuer's (a counter raised by hand, an issuer
	// behind its counters): it is granted again only once the issuer's
	// epoch is raised to that epoch.
	ReasonEpochBehind Reason = "EPOCH_BEHIND"

	// Proof checks (CheckProvenWrite).

	// ReasonBadSignature means the grant proof is malformed, signed by an unknown
	// or retired key, or its signature does not match the record.
	ReasonBadSignature Reason = "BAD_SIGNATURE"
	// ReasonRevokedEpoch means the grant was issued in a revoked issuer epoch.
	ReasonRevokedEpoch Reason = "REVOKED_EPOCH"

	// Segment rules (CheckSegment, ResolveMutation).

	// ReasonInvalidSegment means the segment names no operation root, a sequence
	// below 1, no grant UID or no payload digest.
	ReasonInvalidSegment Reason = "INVALID_SEGMENT"
	// ReasonSequenceGap means the segment is not the next one the resource
	// expects: under the highest fence the next is last+1; a new, larger
	// fence must begin with segment 1 of its operation.
	ReasonSequenceGap Reason = "SEQUENCE_GAP"
	// ReasonSegmentConflict means a segment already accepted is sent again with a
	// different payload. It is quarantined for inspection and never applied.
	ReasonSegmentConflict Reason = "SEGMENT_CONFLICT"
	// ReasonMutationUnknown means the outcome of a write is not known (its
	// acknowledgement was lost, or the store could not tell). The caller
	// looks the receipt up (see ResolveMutation) before doing anything else.
	ReasonMutationUnknown Reason = "MUTATION_UNKNOWN"

	// Session rules (CheckSession).

	// ReasonSessionExpired means the request's session Lease is gone, was
	// replaced, no longer names the owner, or lapsed by the registry's
	// clock: its client is presumed dead, so the request is withdrawn (or
	// the grant ended) and the resource passes on.
	ReasonSessionExpired Reason = "SESSION_EXPIRED"

	// How a grant ended, as the holder library reports it.

	// ReasonTimedOut means the request's wait limit (spec.waitTimeoutSeconds)
	// passed before it was granted; the grant is TimedOut.
	ReasonTimedOut Reason = "TIMED_OUT"
	// ReasonReleased means the grant was released by its owner, or withdrawn
	// before it was granted; the grant is Released.
	ReasonReleased Reason = "RELEASED"
	// ReasonDriverMismatch means the grant is driven by another session. A
	// request ID makes a retry of one attempt idempotent; it never lets a
	// second live process drive the same grant. Only the session that
	// created the grant (or one that proves it is the same attempt) renews
	// and releases it through a Handle.
	ReasonDriverMismatch Reason = "DRIVER_MISMATCH"

	// Refusals of an object's shape rather than of a write's fence.

	// ReasonInvalidSpec means a LockGrant, FenceCounter or FenceIssuer is
	// malformed, or asks for what its spec does not allow (a field of the
	// wrong type, an immutable field changed, a lease longer than its
	// GuardPolicy allows). The refusal names the field.
	ReasonInvalidSpec Reason = "INVALID_SPEC"
	// ReasonInvalidPolicy means a GuardPolicy could not be installed (a bad
	// selector, rule or holder list). The refusal names the field.
	ReasonInvalidPolicy Reason = "INVALID_POLICY"
	// ReasonCounterProtected means a FenceCounter or the FenceIssuer cannot be
	// deleted: a new one would start again from fence 1 or epoch 0 and
	// reissue fences that guarded objects and stores have already seen.
	ReasonCounterProtected Reason = "COUNTER_PROTECTED"
	// ReasonOverrideRefused means an administrator's override of a guarded
	// object (annotation locking.lockwarden.io/override) was refused: it
	// gives no reason, or the object is not wedged (its recorded fence can
	// still be passed by raising the issuer epoch or by the next grant).
	ReasonOverrideRefused Reason = "OVERRIDE_REFUSED"
	// ReasonRequestIDLive means a delete would forget a request ID of the
	// user's choosing that nothing but its grant records yet: the owner's
	// delete of its live grant (waiting or Held), or anyone's delete of an
	// ended grant before the controller recorded its ID as spent. Deleted,
	// the grant would take the ID's record with it, and a retry with the
	// same ID would run the attempt again. A live grant is released with
	// spec.release instead; the controller records the ID as spent before
	// it deletes the ended grant. Nothing changed.
	ReasonRequestIDLive Reason = "REQUEST_ID_LIVE"
	// ReasonInternal means lockwarden could not decide (an API read failed, the
	// request could not be decoded); nothing changed and the request may be
	// retried. Admission metrics count such answers under this code.
	ReasonInternal Reason = "INTERNAL"
)

// Sentinel errors, one per Reason, matched with errors.Is.
var (
	ErrNoFence           = errors.New("fencing: no fence")
	ErrNoResource        = errors.New("fencing: no resource")
	ErrUnknownGrant      = errors.New("fencing: unknown grant")
	ErrBindingMismatch   = errors.New("fencing: binding mismatch")
	ErrNotOwner          = errors.New("fencing: not owner")
	ErrStaleOwner        = errors.New("fencing: stale owner")
	ErrExpired           = errors.New("fencing: expired")
	ErrNotHeld           = errors.New("fencing: not held")
	ErrAlreadyEnded      = errors.New("fencing: already ended")
	ErrFenceRegression   = errors.New("fencing: fence regression")
	ErrRevoked           = errors.New("fencing: revoked")
	ErrFenceNotIssued    = errors.New("fencing: fence not issued")
	ErrSequenceExhausted = errors.New("fencing: sequence of the issuer epoch exhausted")
	ErrEpochBehind       = errors.New("fencing: issuer epoch behind a recorded fence")
	ErrBadSignature      = errors.New("fencing: bad signature")
	ErrRevokedEpoch      = errors.New("fencing: revoked epoch")
	ErrInvalidSegment    = errors.New("fencing: invalid segment")
	ErrSequenceGap       = errors.New("fencing: sequence gap")
	ErrSegmentConflict   = errors.New("fencing: segment conflict")
	ErrMutationUnknown   = errors.New("fencing: mutation outcome unknown")
	ErrSessionExpired    = errors.New("fencing: session expired")

	ErrTimedOut         = errors.New("fencing: wait limit passed before the grant")
	ErrGrantReleased    = errors.New("fencing: grant released")
	ErrDriverMismatch   = errors.New("fencing: grant driven by another session")
	ErrInvalidSpec      = errors.New("fencing: invalid spec")
	ErrInvalidPolicy    = errors.New("fencing: invalid policy")
	ErrCounterProtected = errors.New("fencing: counter protected")
	ErrOverrideRefused  = errors.New("fencing: override refused")
	ErrRequestIDLive    = errors.New("fencing: live grant of a request ID deleted")
	ErrInternal         = errors.New("fencing: internal error")
)

var sentinels = map[Reason]error{
	ReasonNoFence:           ErrNoFence,
	ReasonNoResource:        ErrNoResource,
	ReasonUnknownGrant:      ErrUnknownGrant,
	ReasonBindingMismatch:   ErrBindingMismatch,
	ReasonNotOwner:          ErrNotOwner,
	ReasonStaleOwner:        ErrStaleOwner,
	ReasonExpired:           ErrExpired,
	ReasonNotHeld:           ErrNotHeld,
	ReasonAlreadyEnded:      ErrAlreadyEnded,
	ReasonFenceRegression:   ErrFenceRegression,
	ReasonRevoked:           ErrRevoked,
	ReasonFenceNotIssued:    ErrFenceNotIssued,
	ReasonSequenceExhausted: ErrSequenceExhausted,
	ReasonEpochBehind:       ErrEpochBehind,
	ReasonBadSignature:      ErrBadSignature,
	ReasonRevokedEpoch:      ErrRevokedEpoch,
	ReasonInvalidSegment:    ErrInvalidSegment,
	ReasonSequenceGap:       ErrSequenceGap,
	ReasonSegmentConflict:   ErrSegmentConflict,
	ReasonMutationUnknown:   ErrMutationUnknown,
	ReasonSessionExpired:    ErrSessionExpired,

	ReasonTimedOut:         ErrTimedOut,
	ReasonReleased:         ErrGrantReleased,
	ReasonDriverMismatch:   ErrDriverMismatch,
	ReasonInvalidSpec:      ErrInvalidSpec,
	ReasonInvalidPolicy:    ErrInvalidPolicy,
	ReasonCounterProtected: ErrCounterProtected,
	ReasonOverrideRefused:  ErrOverrideRefused,
	ReasonRequestIDLive:    ErrRequestIDLive,
	ReasonInternal:         ErrInternal,
}

// Error is a refusal: a Reason and a sentence for the user. It matches the
// Reason's sentinel with errors.Is.
type Error struct {
	Reason Reason
	Detail string
}

// Error returns "REASON: detail", the form admission denials use.
func (e *Error) Error() string { return string(e.Reason) + ": " + e.Detail }

// Unwrap returns the sentinel error of e.Reason.
func (e *Error) Unwrap() error { return sentinels[e.Reason] }

// Is reports whether e is a refusal target stands for beyond its own
// sentinel: RELEASED and TIMED_OUT are the two ways a grant is already
// ended, so they match ErrAlreadyEnded too.
func (e *Error) Is(target error) bool {
	return target == ErrAlreadyEnded && (e.Reason == ReasonReleased || e.Reason == ReasonTimedOut)
}

func refuse(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf returns the Reason of a refusal anywhere in err's chain, or "" when
// err is nil or not a refusal.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// ParseReason returns s as a Reason when it is one of the codes above, and
// false otherwise: a decoder of refusals from text accepts only known codes.
func ParseReason(s string) (Reason, bool) {
	r := Reason(s)
	_, ok := sentinels[r]
	return r, ok
}

// Sentinel returns the sentinel error of r (ErrExpired for ReasonExpired,
// ...), or nil for an unknown code.
func (r Reason) Sentinel() error { return sentinels[r] }

// EndsGrant reports whether a refusal with code r, answering a holder's
// renew or release, means the registry will not extend that grant again (it
// expired, was revoked, released, timed out, superseded or deleted, or is
// not the caller's to drive): the holder stops producing effects at once.
// It is false only for the codes that leave the grant as it was: NOT_HELD
// (the request is still queued), INTERNAL (nothing was decided; retry) and
// the codes of a malformed request (INVALID_SPEC, INVALID_POLICY,
// COUNTER_PROTECTED, REQUEST_ID_LIVE). Any other code, an unknown one included, ends the
// grant for its holder: a holder fails closed.
func EndsGrant(r Reason) bool {
	switch r {
	case ReasonNotHeld, ReasonInternal, ReasonInvalidSpec, ReasonInvalidPolicy, ReasonCounterProtected, ReasonRequestIDLive:
		return false
	}
	return true
}

// ConditionReason returns r as Kubernetes API conventions spell condition
// and Event reasons, in CamelCase: EXPIRED is Expired, REVOKED_EPOCH is
// RevokedEpoch, FENCE_REGRESSION is FenceRegression. The code itself stays
// in refusals, condition messages that explain a refusal, and metric labels.
func (r Reason) ConditionReason() string {
	var b strings.Builder
	for _, part := range strings.Split(string(r), "_") {
		if part == "" {
			continue
		}
		b.WriteString(part[:1])
		b.WriteString(strings.ToLower(part[1:]))
	}
	return b.String()
}

// CodeOf returns the code of the catalog whose ConditionReason is s
// (EXPIRED for Expired), or s itself when s names none (Granted, Renewed):
// the form metric labels and alerts use.
func CodeOf(s string) string {
	for r := range sentinels {
		if r.ConditionReason() == s {
			return string(r)
		}
	}
	return s
}
