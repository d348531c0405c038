package main

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

func withKind(e Event, kind string) Event {
	e.Kind = kind
	return e
}

// reasonGone and reasonConflict are the history's codes for a write that
// failed on a precondition: the grant's UID (the grant is gone) or the
// object's resourceVersion.
const (
	reasonGone     = "GONE"
	reasonConflict = "CONFLICT"
)

// classify sorts a request's error into EventOK (nil), EventFail (no
// effect, certainly: an admission refusal, whose reason code it returns, or
// a failed precondition) and EventInfo (unknown: the request may or may not
// have taken effect).
func classify(err error) (string, string) {
	if err == nil {
		return EventOK, ""
	}
	if reason, _, ok := admissionDenial(err); ok {
		return EventFail, reason
	}
	switch {
	case apierrors.IsNotFound(err):
		return EventFail, reasonGone
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return EventFail, reasonConflict
	case apierrors.IsForbidden(err):
		return EventFail, "FORBIDDEN"
	}
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return EventFail, "INVALID"
	}
	return EventInfo, ""
}

// admissionDenial returns the reason code and the message, from the code
// on, of a request refused by a lockwarden admission webhook, as the public
// decoder (pkg/fencing/denial) reads it; ok is false for any other error.
func admissionDenial(err error) (reason, message string, ok bool) {
	r := denial.Refusal(err)
	if r == nil {
		return "", "", false
	}
	return string(r.Reason), r.Error(), true
}
