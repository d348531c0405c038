package lock

import (
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// Sentinel errors, matched with errors.Is. Refusals by the registry are
// *fencing.Error values and match the fencing package's sentinels
// (fencing.ErrExpired, fencing.ErrNotOwner, fencing.ErrAlreadyEnded, ...).
var (
	// ErrWaitTimeout: the request was not granted within its wait limit
	// (the registry timed it out, or the local backstop withdrew it).
	ErrWaitTimeout = errors.New("lock: not acquired within the wait limit")
	// ErrBusy: TryAcquire found the resource held (every permit of it, with
	// WithPermits) or others ahead in its queue; the request was withdrawn.
	ErrBusy = errors.New("lock: the resource is held by another grant")
	// ErrOwnershipUnknown: the local validity deadline passed without proof
	// that the lease was extended. Stop producing effects; the handle cannot
	// be used again.
	ErrOwnershipUnknown = errors.New("lock: ownership unknown")
	// ErrLost: the registry says the handle's acquisition no longer holds
	// (expired, revoked, deleted, ended by someone else, or a renew was
	// refused). It always wraps the *fencing.Error that says why, so
	// errors.Is(err, fencing.ErrRevoked) and fencing.ReasonOf work on it.
	ErrLost = errors.New("lock: ownership lost")
	// ErrReleased: the handle was released by its owner.
	ErrReleased = errors.New("lock: released")
	// ErrWithdrawn: the request was withdrawn (released) before it was
	// granted, by someone other than this call.
	ErrWithdrawn = errors.New("lock: request withdrawn before it was granted")
	// ErrRequestIDConflict: the request ID is already used by a grant for
	// another resource, or by a different request. (A grant for the same
	// request driven by another process is refused with
	// fencing.ErrDriverMismatch instead.)
	ErrRequestIDConflict = errors.New("lock: request ID already used by another request")
	// ErrInvalidOption: an option is out of range (see each With… function).
	ErrInvalidOption = errors.New("lock: invalid option")
)

// Refusal returns the fencing refusal err carries (a *fencing.Error in its
// chain, or one decoded from a lockwarden admission denial by
// pkg/fencing/denial), or nil. Every refusal this package returns already
// matches its fencing sentinel with errors.Is and fencing.ReasonOf; Refusal
// is for errors of other clients, such as a guarded write's.
func Refusal(err error) *fencing.Error { return denial.Refusal(err) }

// refusalOf is the refusal behind a holder machine's final reason (a code
// of the fencing catalog), that code itself: RELEASED and TIMED_OUT too,
// which match fencing.ErrAlreadyEnded as well as their own sentinels.
func refusalOf(reason fencing.Reason) *fencing.Error {
	switch reason {
	case fencing.ReasonReleased:
		return &fencing.Error{Reason: fencing.ReasonReleased, Detail: "the grant was released"}
	case fencing.ReasonTimedOut:
		return &fencing.Error{Reason: fencing.ReasonTimedOut, Detail: "the request's wait limit passed before it was granted"}
	case fencing.ReasonUnknownGrant:
		return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: "the grant was deleted (a forced release), or its name now belongs to another acquisition"}
	case fencing.ReasonRevoked:
		return &fencing.Error{Reason: fencing.ReasonRevoked, Detail: "the issuer revoked the grant"}
	}
	if _, ok := fencing.ParseReason(string(reason)); ok {
		return &fencing.Error{Reason: reason, Detail: "the registry refused or ended this acquisition"}
	}
	return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: "the acquisition ended: " + string(reason)}
}

// lost wraps the reason a holder ended in ErrLost and its refusal.
func lost(reason fencing.Reason) error {
	return fmt.Errorf("%w: %w", ErrLost, refusalOf(reason))
}

// driverMismatch is the refusal of a grant driven by another process.
func driverMismatch(g *lockingv1alpha1.LockGrant) *fencing.Error {
	if g.Annotations[lockingv1alpha1.DriverAnnotation] == "" {
		return &fencing.Error{Reason: fencing.ReasonDriverMismatch, Detail: fmt.Sprintf(
			"grant %s (request ID %q) was made by hand, without a driver token; renew and release it with kubectl lockwarden renew/release", g.Name, g.Spec.RequestID)}
	}
	return &fencing.Error{Reason: fencing.ReasonDriverMismatch, Detail: fmt.Sprintf(
		"grant %s (request ID %q) is driven by another process that acquired it under this request ID; a request ID makes retries of one attempt idempotent, it does not share a lock: wait for that grant to end, or use another request ID", g.Name, g.Spec.RequestID)}
}

// errGone says the acquisition does not exist any more.
var errGone = errors.New("lock: the grant does not exist any more")

// nameTaken is errGone when the grant's name belongs to another
// acquisition now: a later grant with the same name, whose UID it carries.
type nameTaken struct{ uid types.UID }

func (e *nameTaken) Error() string {
	return fmt.Sprintf("%s: the name belongs to acquisition %s now", errGone, e.uid)
}

func (e *nameTaken) Unwrap() error { return errGone }

// retryable reports whether a failed request's outcome is unknown and it may
// be sent again: transport errors, timeouts, throttling and server errors.
// Definite answers (bad request, invalid, forbidden, not found, conflict on
// a precondition, already exists) are not retryable.
func retryable(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true // transport error or a per-request deadline
	}
	switch code := st.Status().Code; {
	case code == http.StatusTooManyRequests, code >= 500, code == 0:
		return true
	}
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}

// testFailed reports whether a JSON patch was refused because one of its
// test operations (the UID or driver-token precondition) failed.
func testFailed(err error) bool {
	var st apierrors.APIStatus
	return errors.As(err, &st) && st.Status().Code == http.StatusUnprocessableEntity
}
