package guard

import (
	"context"
	"net/http"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/lockwarden/lockwarden/internal/denial"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// LabelHandler is the validating webhook for objects labeled
// locking.lockwarden.io/guarded=true (selected by an objectSelector).
type LabelHandler struct{ *Checker }

var _ admission.Handler = &LabelHandler{}

// Handle implements admission.Handler.
func (h *LabelHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	w, err := decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !labeled(w.old) && !labeled(w.new) {
		return admission.Allowed("")
	}
	decision := func() error {
		resource, err := labelResource(w)
		if err != nil {
			return err
		}
		return h.check(ctx, w, resource, nil)
	}()
	observe("label", req, decision)
	return respond(req, decision)
}

// respond turns a decision into an admission response: allowed, denied with
// the reason code first in the message and in details.causes, or an error
// for a failed read.
func respond(req admission.Request, decision error) admission.Response {
	switch {
	case decision == nil:
		return admission.Allowed("")
	case fencing.ReasonOf(decision) == "":
		return admission.Errored(http.StatusInternalServerError, decision)
	}
	gr := schema.GroupResource{Group: req.Resource.Group, Resource: req.Resource.Resource}
	return denial.Response(decision, gr, req.Name)
}
