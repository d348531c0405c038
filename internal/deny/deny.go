// Package deny turns fencing refusals into admission answers that carry
// the reason code twice: first in the message ("STALE_OWNER: ...") for people,
// and as details.causes[0].type for programs, so clients never parse text.
// pkg/fencing/denial reads them back.
package deny

import (
	"errors"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// status is the Forbidden status of a refusal of resource gr/name.
func status(err error, gr schema.GroupResource, name string) metav1.Status {
	st := apierrors.NewForbidden(gr, name, err).ErrStatus
	if r := fencing.ReasonOf(err); r != "" {
		if st.Details == nil {
			st.Details = &metav1.StatusDetails{Group: gr.Group, Kind: gr.Resource, Name: name}
		}
		st.Details.Causes = append(st.Details.Causes, metav1.StatusCause{Type: metav1.CauseType(r), Message: err.Error()})
	}
	return st
}

// Error returns a Forbidden API error for a refusal, for typed validators.
func Error(err error, gr schema.GroupResource, name string) error {
	if err == nil {
		return nil
	}
	return &apierrors.StatusError{ErrStatus: status(err, gr, name)}
}

// Response returns the admission response for a refusal.
func Response(err error, gr schema.GroupResource, name string) admission.Response {
	st := status(err, gr, name)
	// The message users see starts with the reason code.
	st.Message = err.Error()
	st.Code = http.StatusForbidden
	return admission.Response{AdmissionResponse: admissionResponse(st)}
}

// FieldInvalid is a field error whose detail starts with reason code r, for
// Invalid.
func FieldInvalid(path *field.Path, value any, r fencing.Reason, detail string) *field.Error {
	return field.Invalid(path, value, string(r)+": "+detail)
}

// Field is refusal err (a *fencing.Error, such as fencing.CheckCounterName's)
// as a field error about path with value, for Invalid: its detail starts
// with the reason code. An error that is no refusal keeps its text.
func Field(path *field.Path, value any, err error) *field.Error {
	var e *fencing.Error
	if !errors.As(err, &e) {
		return field.Invalid(path, value, err.Error())
	}
	return FieldInvalid(path, value, e.Reason, e.Detail)
}

// Invalid returns the 422 Invalid API error of object gk/name that errs
// refuse (each built by FieldInvalid, so that each detail starts with its
// reason code and names the user's field), or nil when errs is empty.
func Invalid(gk schema.GroupKind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(gk, name, errs)
}

// InvalidResponse is Invalid as an admission response, for handlers that
// answer before decoding the object.
func InvalidResponse(gk schema.GroupKind, name string, errs field.ErrorList) admission.Response {
	return admission.Response{AdmissionResponse: admissionResponse(apierrors.NewInvalid(gk, name, errs).ErrStatus)}
}
