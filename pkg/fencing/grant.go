package fencing

import "time"

// State is where a grant is in its life, as the registry reports it.
type State int

const (
	// StatePending means the request waits in the resource's queue.
	StatePending State = iota
	// StateHeld means the grant is held until ExpiresAt.
	StateHeld
	// StateExpired means the lease ran out. Final.
	StateExpired
	// StateReleased means the grant was released by its owner (or withdrawn before being granted). Final.
	StateReleased
	// StateTimedOut means the wait limit passed before it was granted. Final.
	StateTimedOut
	// StateRevoked means the issuer ended the grant (revoked epoch, policy). Final.
	StateRevoked
)

// Grant is what the registry says about one acquisition. Enforcement points
// must build it from a linearizable read (a direct GET, not an informer
// cache).
type Grant struct {
	// UID is the acquisition's owner token (the LockGrant UID).
	UID string
	// Resource is the resource ID the grant is for.
	Resource string
	// Owner is the workload identity that holds it.
	Owner string
	// Steward is the identity that drives the grant on its owner's behalf
	// (renews and releases it), or "" when only the owner does: the
	// manager, for the grant of a lock-gated Pod (CheckGrantCreate).
	Steward string
	// State is the grant's state.
	State State
	// Fence is the fencing token issued to the grant; 0 before it is Held.
	Fence int64
	// ExpiresAt is the end of the lease by the registry's clock; zero when
	// not Held.
	ExpiresAt time.Time
}

// Counter is the registry's per-resource fence record.
type Counter struct {
	// Fence is the highest fencing token ever issued for the resource.
	Fence int64
	// HolderUID is the UID of the grant that holds the resource, or "" when free.
	HolderUID string
}

// Expired reports whether a lease ending at expiresAt is over at now. The
// end instant itself is expired: a lease of 5 s granted at t=0 is over at t=5.
func Expired(expiresAt, now time.Time) bool { return !now.Before(expiresAt) }

// drives reports whether caller may renew or release grant g: its owner, or
// its steward when it has one.
func (g Grant) drives(caller string) bool {
	return caller == g.Owner || (g.Steward != "" && caller == g.Steward)
}

// CheckRenew reports whether caller (the owner, or the grant's steward) may
// renew grant g at now. It returns nil, or an *Error with ReasonNotOwner
// (another identity), ReasonExpired (the lease is over: a renew never
// re-acquires), ReasonAlreadyEnded (released or timed out) or
// ReasonNotHeld (still queued).
func CheckRenew(g Grant, caller string, now time.Time) error {
	if !g.drives(caller) {
		return refuse(ReasonNotOwner, "%q cannot renew a grant owned by %q", caller, g.Owner)
	}
	switch g.State {
	case StatePending:
		return refuse(ReasonNotHeld, "the grant is still waiting in the queue")
	case StateExpired:
		return refuse(ReasonExpired, "the grant has expired; acquire again for a new fence")
	case StateReleased, StateTimedOut:
		return refuse(ReasonAlreadyEnded, "the grant has already ended")
	case StateRevoked:
		return refuse(ReasonRevoked, "the issuer revoked the grant")
	}
	if Expired(g.ExpiresAt, now) {
		return refuse(ReasonExpired, "the lease expired at %s; acquire again for a new fence", g.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// CheckRelease reports whether caller may release grant g at now: the owner
// (or its steward) may release a Held, unexpired grant or withdraw a Pending request. It
// returns nil, or an *Error with ReasonNotOwner, ReasonExpired or
// ReasonAlreadyEnded.
func CheckRelease(g Grant, caller string, now time.Time) error {
	if !g.drives(caller) {
		return refuse(ReasonNotOwner, "%q cannot release a grant owned by %q", caller, g.Owner)
	}
	switch g.State {
	case StatePending:
		return nil
	case StateExpired:
		return refuse(ReasonExpired, "the grant has already expired")
	case StateReleased, StateTimedOut:
		return refuse(ReasonAlreadyEnded, "the grant has already ended")
	case StateRevoked:
		return refuse(ReasonRevoked, "the issuer revoked the grant")
	}
	if Expired(g.ExpiresAt, now) {
		return refuse(ReasonExpired, "the lease expired at %s", g.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
