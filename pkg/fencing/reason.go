package fencing

import (
	"errors"
	"fmt"
)

// Reason is the machine-readable code of a refusal. The same codes appear in
// admission denials, LockGrant conditions, Events and metrics.
type Reason string

const (
	// ReasonNoFence: the write carries no grant reference or fence, or a
	// malformed one.
	ReasonNoFence Reason = "NO_FENCE"
	// ReasonNoResource: a guarded object does not name a valid resource ID.
	ReasonNoResource Reason = "NO_RESOURCE"
	// ReasonUnknownGrant: the registry has no such grant, or no record of the
	// resource.
	ReasonUnknownGrant Reason = "UNKNOWN_GRANT"
	// ReasonBindingMismatch: the grant is for another resource, or the fence
	// presented is not the one the grant was issued.
	ReasonBindingMismatch Reason = "BINDING_MISMATCH"
	// ReasonNotOwner: the caller is not the grant's owner.
	ReasonNotOwner Reason = "NOT_OWNER"
	// ReasonStaleOwner: a newer fence has been issued for the resource or
	// accepted by the object; the grant is superseded.
	ReasonStaleOwner Reason = "STALE_OWNER"
	// ReasonExpired: the grant's lease is over (at expiresAt, equality
	// included) and no newer grant superseded it yet.
	ReasonExpired Reason = "EXPIRED"
	// ReasonNotHeld: the grant is still waiting in the queue.
	ReasonNotHeld Reason = "NOT_HELD"
	// ReasonAlreadyEnded: the grant was already released or its wait timed out.
	ReasonAlreadyEnded Reason = "ALREADY_ENDED"
	// ReasonFenceRegression: the registry issued a fence the resource had
	// already seen from another grant or operation (a restore from an old
	// snapshot), or a write would lower a recorded fence.
	ReasonFenceRegression Reason = "FENCE_REGRESSION"
	// ReasonRevoked: the issuer ended the grant before its lease ran out
	// (its epoch was revoked or superseded, or its policy stopped allowing it).
	ReasonRevoked Reason = "REVOKED"

	// Proof checks (CheckProvenWrite).

	// ReasonBadSignature: the grant proof is malformed, signed by an unknown
	// or retired key, or its signature does not match the record.
	ReasonBadSignature Reason = "BAD_SIGNATURE"
	// ReasonRevokedEpoch: the grant was issued in a revoked issuer epoch.
	ReasonRevokedEpoch Reason = "REVOKED_EPOCH"

	// Segment rules (CheckSegment, ResolveMutation).

	// ReasonInvalidSegment: the segment names no operation root, a sequence
	// below 1, no grant UID or no payload digest.
	ReasonInvalidSegment Reason = "INVALID_SEGMENT"
	// ReasonSequenceGap: the segment is not the next one the resource
	// expects: under the highest fence the next is last+1; a new, larger
	// fence must begin with segment 1 of its operation.
	ReasonSequenceGap Reason = "SEQUENCE_GAP"
	// ReasonSegmentConflict: a segment already accepted is sent again with a
	// different payload. It is quarantined for inspection and never applied.
	ReasonSegmentConflict Reason = "SEGMENT_CONFLICT"
	// ReasonMutationUnknown: the outcome of a write is not known (its
	// acknowledgement was lost, or the store could not tell). The caller
	// looks the receipt up (see ResolveMutation) before doing anything else.
	ReasonMutationUnknown Reason = "MUTATION_UNKNOWN"

	// Session rules (CheckSession).

	// ReasonSessionExpired: the request's session Lease is gone, was
	// replaced, no longer names the owner, or lapsed by the registry's
	// clock: its client is presumed dead, so the request is withdrawn (or
	// the grant ended) and the resource passes on.
	ReasonSessionExpired Reason = "SESSION_EXPIRED"
)

// Sentinel errors, one per Reason, matched with errors.Is.
var (
	ErrNoFence         = errors.New("fencing: no fence")
	ErrNoResource      = errors.New("fencing: no resource")
	ErrUnknownGrant    = errors.New("fencing: unknown grant")
	ErrBindingMismatch = errors.New("fencing: binding mismatch")
	ErrNotOwner        = errors.New("fencing: not owner")
	ErrStaleOwner      = errors.New("fencing: stale owner")
	ErrExpired         = errors.New("fencing: expired")
	ErrNotHeld         = errors.New("fencing: not held")
	ErrAlreadyEnded    = errors.New("fencing: already ended")
	ErrFenceRegression = errors.New("fencing: fence regression")
	ErrRevoked         = errors.New("fencing: revoked")
	ErrBadSignature    = errors.New("fencing: bad signature")
	ErrRevokedEpoch    = errors.New("fencing: revoked epoch")
	ErrInvalidSegment  = errors.New("fencing: invalid segment")
	ErrSequenceGap     = errors.New("fencing: sequence gap")
	ErrSegmentConflict = errors.New("fencing: segment conflict")
	ErrMutationUnknown = errors.New("fencing: mutation outcome unknown")
	ErrSessionExpired  = errors.New("fencing: session expired")
)

var sentinels = map[Reason]error{
	ReasonNoFence:         ErrNoFence,
	ReasonNoResource:      ErrNoResource,
	ReasonUnknownGrant:    ErrUnknownGrant,
	ReasonBindingMismatch: ErrBindingMismatch,
	ReasonNotOwner:        ErrNotOwner,
	ReasonStaleOwner:      ErrStaleOwner,
	ReasonExpired:         ErrExpired,
	ReasonNotHeld:         ErrNotHeld,
	ReasonAlreadyEnded:    ErrAlreadyEnded,
	ReasonFenceRegression: ErrFenceRegression,
	ReasonRevoked:         ErrRevoked,
	ReasonBadSignature:    ErrBadSignature,
	ReasonRevokedEpoch:    ErrRevokedEpoch,
	ReasonInvalidSegment:  ErrInvalidSegment,
	ReasonSequenceGap:     ErrSequenceGap,
	ReasonSegmentConflict: ErrSegmentConflict,
	ReasonMutationUnknown: ErrMutationUnknown,
	ReasonSessionExpired:  ErrSessionExpired,
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

// Holder-side reasons: refusals the holder library and kubectl lock give
// before or instead of asking the registry.
const (
	// ReasonDriverMismatch: the grant is driven by another session. A
	// request ID makes a retry of one attempt idempotent; it never lets a
	// second live process drive the same grant. Only the session that
	// created the grant (or one that proves it is the same attempt) renews
	// and releases it through a Handle.
	ReasonDriverMismatch Reason = "DRIVER_MISMATCH"
)

// ErrDriverMismatch is the sentinel of ReasonDriverMismatch.
var ErrDriverMismatch = errors.New("fencing: grant driven by another session")

func init() { sentinels[ReasonDriverMismatch] = ErrDriverMismatch }

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
