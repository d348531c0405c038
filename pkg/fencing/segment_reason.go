package fencing

import "errors"

// Reason codes of the segment rules (CheckSegment, ResolveMutation). They
// join the codes in reason.go and reach users the same ways.
const (
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
)

// Sentinel errors of the segment reasons, matched with errors.Is.
var (
	ErrInvalidSegment  = errors.New("fencing: invalid segment")
	ErrSequenceGap     = errors.New("fencing: sequence gap")
	ErrSegmentConflict = errors.New("fencing: segment conflict")
	ErrMutationUnknown = errors.New("fencing: mutation outcome unknown")
)

func init() {
	sentinels[ReasonInvalidSegment] = ErrInvalidSegment
	sentinels[ReasonSequenceGap] = ErrSequenceGap
	sentinels[ReasonSegmentConflict] = ErrSegmentConflict
	sentinels[ReasonMutationUnknown] = ErrMutationUnknown
}
