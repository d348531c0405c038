package postgres

import (
	"fmt"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Refusal is a segment the resource refused. It unwraps to Err, so
// errors.Is matches the reason's sentinel (fencing.ErrFenceRegression,
// fencing.ErrStaleOwner, ...) and fencing.ReasonOf returns the reason.
type Refusal struct {
	// Err is the reason and a sentence for the user.
	Err *fencing.Error
	// Scope, Resource, Caller and Segment describe the refused write;
	// Segment carries the payload's digest, not the payload.
	Scope    Scope
	Resource string
	Caller   string
	Segment  fencing.Segment
	// Ledger is the resource's record when it refused; a refusal never
	// changes it.
	Ledger fencing.Ledger
	// Quarantined reports that the payload was kept in
	// lockwarden_quarantine (SEGMENT_CONFLICT).
	Quarantined bool
}

// Error returns `postgres: resource "R" in namespace "N" of cluster "C"
// refused segment S of ROOT under fence F: REASON: detail`.
func (r *Refusal) Error() string {
	return fmt.Sprintf("postgres: %s refused segment %d of %s under fence %d: %v",
		ref{Scope: r.Scope, resource: r.Resource}, r.Segment.Seq, r.Segment.Root, r.Segment.Fence, r.Err)
}

// Unwrap returns Err.
func (r *Refusal) Unwrap() error { return r.Err }
