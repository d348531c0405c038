// Package denial reads lockwarden's refusals back out of Kubernetes API
// errors, for clients: the holder library, kubectl lock, and any program
// that writes guarded objects.
//
// lockwarden's admission webhooks answer a refused request with a 403 whose
// status carries the reason code twice: as details.causes[].type, for
// programs, and at the start of the refusal text ("STALE_OWNER: fence 1 is
// older than ..."), for people. Its admission policy (the renew and release
// of a LockGrant, judged inside the API server) cannot set a cause's type:
// its refusal text starts with the code, after the API server's prefix
// ("ValidatingAdmissionPolicy '...' with binding '...' denied request:
// NOT_OWNER: ..."). Refusal reads the causes first and falls back to the
// text for a status without a typed cause, accepting only the codes package
// fencing defines. It never guesses: an error that is not such a refusal
// gives nil.
//
//	if err := c.Update(ctx, obj); err != nil {
//		if errors.Is(denial.Wrap(err), fencing.ErrStaleOwner) { ... }
//	}
package denial

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Reason returns the reason code of a refusal in err, or "" when err is not
// a lockwarden refusal.
func Reason(err error) fencing.Reason {
	if r := Refusal(err); r != nil {
		return r.Reason
	}
	return ""
}

// Refusal returns the *fencing.Error err carries: err's own (anywhere in its
// chain), or the one decoded from a 403 Forbidden API status, from its
// details.causes first and otherwise from its message. It returns nil when
// err carries none.
func Refusal(err error) *fencing.Error {
	if err == nil {
		return nil
	}
	var fe *fencing.Error
	if errors.As(err, &fe) {
		return fe
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) || !apierrors.IsForbidden(err) {
		return nil
	}
	status := st.Status()
	if d := status.Details; d != nil {
		for _, c := range d.Causes {
			r, ok := fencing.ParseReason(string(c.Type))
			if !ok {
				continue
			}
			return &fencing.Error{Reason: r, Detail: detail(c.Message, r)}
		}
	}
	return fromText(status.Message)
}

// Wrap returns err such that errors.Is matches the sentinel of the refusal it
// carries (fencing.ErrStaleOwner, ...) and errors.As finds the
// *fencing.Error, while the API error stays in the chain too
// (apierrors.IsForbidden still holds). Other errors are returned as they are.
func Wrap(err error) error {
	r := Refusal(err)
	if r == nil {
		return err
	}
	var fe *fencing.Error
	if errors.As(err, &fe) {
		return err
	}
	return &refusal{ref: r, err: err}
}

// refusal is an API error with the refusal decoded from it.
type refusal struct {
	ref *fencing.Error
	err error
}

func (e *refusal) Error() string   { return e.err.Error() }
func (e *refusal) Unwrap() []error { return []error{e.ref, e.err} }

// detail strips the reason code from the start of a refusal's text.
func detail(msg string, r fencing.Reason) string {
	if i := strings.Index(msg, string(r)+": "); i >= 0 {
		msg = msg[i+len(r)+2:]
	}
	return strings.TrimSpace(msg)
}

// fromText finds "CODE: detail" in a status message, where CODE is a known
// reason that starts the message or follows a space, colon or quote.
func fromText(msg string) *fencing.Error {
	for off := 0; ; {
		i := strings.Index(msg[off:], ": ")
		if i < 0 {
			return nil
		}
		end := off + i
		start := strings.LastIndexAny(msg[:end], " :\"'") + 1
		if r, ok := fencing.ParseReason(msg[start:end]); ok {
			return &fencing.Error{Reason: r, Detail: strings.TrimSpace(msg[end+2:])}
		}
		off = end + 2
	}
}
