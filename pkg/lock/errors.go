package lock

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/lockwarden/lockwarden/internal/denial"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Sentinel errors, matched with errors.Is. Refusals by the registry are
// *fencing.Error values and match the fencing package's sentinels
// (fencing.ErrExpired, fencing.ErrNotOwner, fencing.ErrAlreadyEnded, ...).
var (
	// ErrWaitTimeout: the request was not granted within its wait limit
	// (the registry timed it out, or the local backstop withdrew it).
	ErrWaitTimeout = errors.New("lock: not acquired within the wait limit")
	// ErrBusy: TryAcquire found the resource held; the request was withdrawn.
	ErrBusy = errors.New("lock: the resource is held by another grant")
	// ErrOwnershipUnknown: the local validity deadline passed without proof
	// that the lease was extended. Stop producing effects; the handle cannot
	// be used again.
	ErrOwnershipUnknown = errors.New("lock: ownership unknown")
	// ErrLost: the registry says the acquisition no longer holds (expired,
	// deleted, ended by someone else, or refused). The wrapped error, when
	// there is one, is the *fencing.Error that says why.
	ErrLost = errors.New("lock: ownership lost")
	// ErrReleased: the handle was released by its owner.
	ErrReleased = errors.New("lock: released")
	// ErrWithdrawn: the request was withdrawn (released) before it was
	// granted, by someone other than this call.
	ErrWithdrawn = errors.New("lock: request withdrawn before it was granted")
	// ErrRequestIDConflict: the request ID is already used by a grant for
	// another resource, or by a different request.
	ErrRequestIDConflict = errors.New("lock: request ID already used by another request")
	// ErrInvalidOption: an option is out of range (see each With… function).
	ErrInvalidOption = errors.New("lock: invalid option")
)

// refusalRE finds a reason code at the start of a fencing refusal inside an
// admission denial, e.g. `... is forbidden: EXPIRED: the lease expired at ...`;
// for denials from servers that do not set details.causes.
var refusalRE = regexp.MustCompile(`(?:^|[\s:])([A-Z][A-Z_]+[A-Z]): `)

// Refusal returns the fencing refusal carried by an admission denial (a 403
// whose details.causes[0].type is the reason code, as lockwarden's webhooks
// write it, with "REASON: detail" in the message), or nil when err is not
// such a denial.
func Refusal(err error) *fencing.Error {
	if err == nil {
		return nil
	}
	var fe *fencing.Error
	if errors.As(err, &fe) {
		return fe
	}
	if !apierrors.IsForbidden(err) {
		return nil
	}
	msg := err.Error()
	if r := denial.Reason(err); r != "" {
		detail := msg
		if i := strings.Index(msg, string(r)+": "); i >= 0 {
			detail = msg[i+len(r)+2:]
		}
		return &fencing.Error{Reason: r, Detail: strings.TrimSpace(detail)}
	}
	m := refusalRE.FindStringSubmatchIndex(msg)
	if m == nil {
		return nil
	}
	return &fencing.Error{Reason: fencing.Reason(msg[m[2]:m[3]]), Detail: strings.TrimSpace(msg[m[3]+2:])}
}

// lost wraps the reason a holder ended in ErrLost.
func lost(reason string) error {
	switch fencing.Reason(reason) {
	case fencing.ReasonExpired, fencing.ReasonNotOwner, fencing.ReasonAlreadyEnded:
		return fmt.Errorf("%w: %w", ErrLost, &fencing.Error{Reason: fencing.Reason(reason), Detail: "the registry refused or ended this acquisition"})
	}
	return fmt.Errorf("%w: %s", ErrLost, reason)
}

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
