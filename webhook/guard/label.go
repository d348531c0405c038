package guard

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// LabelHandler is the webhook for objects labeled
// locking.lockwarden.io/guarded (selected by an objectSelector on the label's
// presence). It serves two configurations: the mutating one for creates and
// updates (of the object and of subresources whose body is the object, such
// as status), which checks and consumes the claim, and the validating one for
// deletes. A label value other than "true" guards nothing, and the write is
// admitted with a warning that says so.
//
// An object labeled guarded and also covered by an Enforce GuardPolicy is
// judged here alone, under that policy's rules (its resource ID, proofs,
// verified records); the policy's own webhook leaves it to this one, so that
// one webhook consumes each claim.
type LabelHandler struct {
	*Checker
	// Policies reads GuardPolicies (a cache is fine); nil: none apply.
	Policies client.Reader
}

var _ admission.Handler = &LabelHandler{}

// Handle implements admission.Handler.
func (h *LabelHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if opaque(req.SubResource) {
		return admission.Allowed("") // SubresourceHandler's
	}
	w, err := decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if !labeled(w.old) && !labeled(w.new) {
		return labelWarning(w)
	}
	var rec fencing.Accepted
	decision := func() error {
		g, err := labelGuarding(w)
		if err != nil {
			return err
		}
		pols, err := enforcing(ctx, h.Policies, req, w.old, w.new)
		if err != nil {
			return err
		}
		if err := policy.CheckOne(pols); err != nil {
			return err
		}
		if len(pols) == 1 {
			if g, err = policyGuarding(w, pols[0], labeled(w.new)); err != nil {
				return err
			}
		}
		rec, err = h.decide(ctx, w, g)
		return err
	}()
	observe("label", req, decision)
	if decision != nil || req.Operation == admissionv1.Delete {
		return respond(req, decision)
	}
	return consume(w.new, rec)
}

// LabelWarner is the validating webhook, with failurePolicy Ignore, for
// objects whose guard label has a value other than "true": it admits every
// write, with a warning that the label guards nothing. It is a webhook of its
// own so that the fail-closed guarded-write webhooks select only guarded
// objects and never hold such a write up while no replica answers.
type LabelWarner struct{}

var _ admission.Handler = LabelWarner{}

// Handle implements admission.Handler.
func (LabelWarner) Handle(_ context.Context, req admission.Request) admission.Response {
	w, err := decode(req)
	if err != nil || labeled(w.new) {
		return admission.Allowed("")
	}
	return labelWarning(w)
}

// labelWarning admits a write that leaves the object unguarded, warning when
// it carries the guard label with another value than "true".
func labelWarning(w write) admission.Response {
	if v, ok := w.new.labelValue(); ok {
		return admission.Allowed("").WithWarnings(fmt.Sprintf(
			"label %s=%q does not guard this object: only the value \"true\" does", lockingv1alpha1.GuardedLabel, v))
	}
	return admission.Allowed("")
}

// labelValue is the guard label's value on o, if it has one.
func (o *object) labelValue() (string, bool) {
	if o == nil {
		return "", false
	}
	v, ok := o.Labels[lockingv1alpha1.GuardedLabel]
	return v, ok
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
	return deny.Response(decision, gr, req.Name)
}
