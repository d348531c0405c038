// Package fencecounter is the admission webhook of FenceCounters: a counter
// must be named after its resource and is never deleted while its namespace
// exists. That nobody, the controller included, lowers a recorded fence is
// the CRD's validation rule.
package fencecounter

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// Validator guards FenceCounters.
type Validator struct {
	// Reader lists grants directly from the API server on delete.
	Reader client.Reader
}

var _ admission.Validator[*lockingv1alpha1.FenceCounter] = &Validator{}

// NewValidator returns the validating webhook of FenceCounters.
func NewValidator(s *runtime.Scheme, r client.Reader) *admission.Webhook {
	return admission.WithValidator(s, &Validator{Reader: r})
}

// ValidateCreate checks that the counter is named after its resource.
func (v *Validator) ValidateCreate(_ context.Context, c *lockingv1alpha1.FenceCounter) (admission.Warnings, error) {
	if err := fencing.CheckCounterName(c.Name, c.Spec.Resource, lockingv1alpha1.FenceCounterName(c.Spec.Resource)); err != nil {
		return nil, deny.Invalid(lockingv1alpha1.GroupVersion.WithKind("FenceCounter").GroupKind(), c.Name, field.ErrorList{
			deny.Field(field.NewPath("metadata", "name"), c.Name, err)})
	}
	return nil, nil
}

// ValidateUpdate refuses any decrease of spec.fence with FENCE_REGRESSION.
// The webhook is registered for CREATE and DELETE only: the CRD's own rule
// ("fence never decreases", enforced by the API server on every write)
// already refuses a decrease, and the controller's compare-and-swap on the
// handoff path then costs no webhook call. ValidateUpdate stays for
// clusters that register UPDATE too.
func (v *Validator) ValidateUpdate(_ context.Context, oldC, newC *lockingv1alpha1.FenceCounter) (admission.Warnings, error) {
	if err := fencing.CheckCounterUpdate(oldC.Spec.Fence, newC.Spec.Fence); err != nil {
		return nil, forbid(newC.Name, err)
	}
	return nil, nil
}

// ValidateDelete refuses deletion unless the counter's namespace is being
// deleted: a counter recreated from zero would reissue fences that guarded
// objects and stores outside the cluster have already seen, even after every
// grant of the resource is gone. The namespace is read directly from the
// API server. The refusal is COUNTER_PROTECTED.
func (v *Validator) ValidateDelete(ctx context.Context, c *lockingv1alpha1.FenceCounter) (admission.Warnings, error) {
	terminating, err := facts.NamespaceTerminating(ctx, v.Reader, c.Namespace)
	if err != nil {
		return nil, err
	}
	if err := fencing.CheckCounterDelete(terminating, c.Spec.Resource); err != nil {
		return nil, forbid(c.Name, err)
	}
	return nil, nil
}

func forbid(name string, err error) error {
	return deny.Error(err, lockingv1alpha1.GroupVersion.WithResource("fencecounters").GroupResource(), name)
}
