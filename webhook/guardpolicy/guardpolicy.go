// Package guardpolicy is the admission webhook of GuardPolicies: it refuses
// a policy that could not be installed (internal/policy.Validate), so that a
// typo never reaches the webhook configuration every policy shares.
package guardpolicy

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/internal/policy"
)

// Validator refuses unusable GuardPolicies.
type Validator struct{}

var _ admission.Validator[*lockingv1alpha1.GuardPolicy] = Validator{}

// NewValidator returns the validating webhook of GuardPolicies.
func NewValidator(s *runtime.Scheme) *admission.Webhook {
	return admission.WithValidator(s, Validator{})
}

// ValidateCreate refuses an unusable policy with INVALID_POLICY.
func (Validator) ValidateCreate(_ context.Context, p *lockingv1alpha1.GuardPolicy) (admission.Warnings, error) {
	return nil, check(p)
}

// ValidateUpdate refuses an unusable policy with INVALID_POLICY.
func (Validator) ValidateUpdate(_ context.Context, _, p *lockingv1alpha1.GuardPolicy) (admission.Warnings, error) {
	return nil, check(p)
}

// ValidateDelete allows deletion.
func (Validator) ValidateDelete(context.Context, *lockingv1alpha1.GuardPolicy) (admission.Warnings, error) {
	return nil, nil
}

// check refuses an unusable policy with a 422 Invalid error whose every
// field detail starts with INVALID_POLICY (policy.Refusals).
func check(p *lockingv1alpha1.GuardPolicy) error {
	return deny.Invalid(lockingv1alpha1.GroupVersion.WithKind("GuardPolicy").GroupKind(), p.Name, policy.Refusals(p))
}
