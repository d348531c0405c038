// Package fencecounter is the admission webhook of FenceCounters: a counter
// must be named after its resource and cannot be deleted while its resource
// has grants. That nobody, the controller included, lowers a recorded fence
// is the CRD's validation rule.
package fencecounter

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
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
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the FenceCounter of resource %q must be named %q", c.Spec.Resource, want))
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

// ValidateDelete refuses deletion while any LockGrant of the resource
// exists, whatever its phase: a counter recreated from zero would reissue
// fences. The grants are listed directly from the API server.
func (v *Validator) ValidateDelete(ctx context.Context, c *lockingv1alpha1.FenceCounter) (admission.Warnings, error) {
	var list lockingv1alpha1.LockGrantList
	if err := v.Reader.List(ctx, &list, client.InNamespace(c.Namespace)); err != nil {
		return nil, fmt.Errorf("listing grants: %w", err)
	}
	n := 0
	for i := range list.Items {
		if list.Items[i].Spec.Resource == c.Spec.Resource {
			n++
		}
	}
	if n > 0 {
		return nil, forbid(c.Name, &fencing.Error{Reason: fencing.ReasonFenceRegression,
			Detail: fmt.Sprintf("resource %q still has %d LockGrant(s); deleting its counter would let fences be reissued", c.Spec.Resource, n)})
	}
	return nil, nil
}

func forbid(name string, err error) error {
	return denial.Error(err, lockingv1alpha1.GroupVersion.WithResource("fencecounters").GroupResource(), name)
}
