// Package fencecounter is the admission webhook of FenceCounters: a counter
// must be named after its resource and is never deleted while its namespace
// exists. That nobody, the controller included, lowers a recorded fence is
// the CRD's validation rule.
package fencecounter

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/denial"
	"github.com/lockwarden/lockwarden/pkg/fencing"
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
	if want := lockingv1alpha1.FenceCounterName(c.Spec.Resource); c.Name != want {
		return nil, denial.Invalid(lockingv1alpha1.GroupVersion.WithKind("FenceCounter").GroupKind(), c.Name, field.ErrorList{
			denial.FieldInvalid(field.NewPath("metadata", "name"), c.Name, fencing.ReasonInvalidSpec,
				fmt.Sprintf("the FenceCounter of resource %q must be named %q", c.Spec.Resource, want))})
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
	if newC.Spec.Fence < oldC.Spec.Fence {
		return nil, forbid(newC.Name, &fencing.Error{Reason: fencing.ReasonFenceRegression,
			Detail: fmt.Sprintf("fence may never decrease (%d -> %d)", oldC.Spec.Fence, newC.Spec.Fence)})
	}
	return nil, nil
}

// ValidateDelete refuses deletion unless the counter's namespace is being
// deleted: a counter recreated from zero would reissue fences that guarded
// objects and stores outside the cluster have already seen, even after every
// grant of the resource is gone. The namespace is read directly from the
// API server. The refusal is COUNTER_PROTECTED.
func (v *Validator) ValidateDelete(ctx context.Context, c *lockingv1alpha1.FenceCounter) (admission.Warnings, error) {
	ns := &corev1.Namespace{}
	if err := v.Reader.Get(ctx, types.NamespacedName{Name: c.Namespace}, ns); err != nil {
		return nil, fmt.Errorf("reading namespace %s: %w", c.Namespace, err)
	}
	if ns.DeletionTimestamp != nil {
		return nil, nil
	}
	return nil, forbid(c.Name, &fencing.Error{Reason: fencing.ReasonCounterProtected,
		Detail: fmt.Sprintf("the fence record of resource %q is kept as long as its namespace: a new one would reissue fences from 1", c.Spec.Resource)})
}

func forbid(name string, err error) error {
	return denial.Error(err, lockingv1alpha1.GroupVersion.WithResource("fencecounters").GroupResource(), name)
}
