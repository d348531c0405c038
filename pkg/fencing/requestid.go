package fencing

import (
	"fmt"
	"time"
)

// SpentRequest is what the registry remembers of a request ID whose grant
// ended and was deleted (a namespace's request-ID ledger): a request ID
// names one acquisition, and a retry that uses it again must not run the
// attempt a second time.
type SpentRequest struct {
	// RequestID is the request ID.
	RequestID string
	// State is how its grant ended: StateReleased, StateTimedOut,
	// StateExpired or StateRevoked.
	State State
	// EndedAt is when its grant ended, by the registry's clock.
	EndedAt time.Time
	// SpentUntil ends the window in which the ID is refused, by the
	// registry's clock.
	SpentUntil time.Time
}

// Records reports whether s, the registry's record of a request ID, is the
// record of a grant with that ID that ended at ended with request-ID window
// window: it keeps the ID spent at least until the end of that grant's
// window. A record keeps times to the second, so the window's end is
// compared truncated to the second. False for nil.
func (s *SpentRequest) Records(ended time.Time, window time.Duration) bool {
	return s != nil && !s.SpentUntil.Before(ended.Add(window).Truncate(time.Second))
}

// CheckRequestID reports whether a new request may use a request ID the
// registry remembers as spent (spent nil: it remembers none), at now by the
// registry's clock. Within the ID's window (before SpentUntil) it refuses
// with the reason its grant ended, as for a retry that finds the ended
// grant itself: ReasonAlreadyEnded (released, or timed out in the queue),
// ReasonExpired or ReasonRevoked. After the window the request is allowed,
// and notice says that it reuses a spent request ID, and how and when the
// earlier grant ended, for the requester to be told: the request runs as a
// new attempt. nil and "" for an ID the registry does not remember.
func CheckRequestID(spent *SpentRequest, now time.Time) (notice string, err error) {
	if spent == nil {
		return "", nil
	}
	ended := fmt.Sprintf("its grant ended (%s) at %s", spent.State, spent.EndedAt.UTC().Format(time.RFC3339))
	if now.Before(spent.SpentUntil) {
		return "", refuse(SpentReason(spent.State), "request ID %q is spent: %s; it stays spent until %s: use a new request ID for a new attempt",
			spent.RequestID, ended, spent.SpentUntil.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("request ID %q was spent: %s, and its window passed at %s; this request runs as a new attempt",
		spent.RequestID, ended, spent.SpentUntil.UTC().Format(time.RFC3339)), nil
}

// SpentReason is the refusal code of a retry with a request ID whose grant
// ended in state s, whether the retry finds the ended grant or the
// registry's record of it: EXPIRED, REVOKED, or ALREADY_ENDED (released,
// withdrawn, or timed out in the queue).
func SpentReason(s State) Reason {
	switch s {
	case StateExpired:
		return ReasonExpired
	case StateRevoked:
		return ReasonRevoked
	}
	return ReasonAlreadyEnded
}

// String returns the state's name as a LockGrant's phase says it.
func (s State) String() string {
	switch s {
	case StatePending:
		return "Pending"
	case StateHeld:
		return "Held"
	case StateExpired:
		return "Expired"
	case StateReleased:
		return "Released"
	case StateTimedOut:
		return "TimedOut"
	case StateRevoked:
		return "Revoked"
	}
	return fmt.Sprintf("State(%d)", int(s))
}
