// Package fenceissuer is the admission webhook of FenceIssuers: the issuer
// cannot be deleted. A new one would start again at epoch 0 with no revoked
// epochs and a new key under an old key ID; its rules for changing (epochs
// and revocations only move forward, one Active key) are the CRD's.
package fenceissuer

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Validator refuses to delete a FenceIssuer.
type Validator struct{}

var _ admission.Validator[*lockingv1alpha1.FenceIssuer] = Validator{}

// NewValidator returns the validating webhook of FenceIssuers.
func NewValidator(s *runtime.Scheme) *admission.Webhook {
	return admission.WithValidator(s, Validator{})
}

// ValidateCreate allows creation.
func (Validator) ValidateCreate(context.Context, *lockingv1alpha1.FenceIssuer) (admission.Warnings, error) {
	return nil, nil
}

// ValidateUpdate allows updates; the CRD's rules guard them.
func (Validator) ValidateUpdate(context.Context, *lockingv1alpha1.FenceIssuer, *lockingv1alpha1.FenceIssuer) (admission.Warnings, error) {
	return nil, nil
}

// ValidateDelete refuses with COUNTER_PROTECTED.
func (Validator) ValidateDelete(_ context.Context, iss *lockingv1alpha1.FenceIssuer) (admission.Warnings, error) {
	return nil, deny.Error(fencing.CheckIssuerDelete(), lockingv1alpha1.GroupVersion.WithResource("fenceissuers").GroupResource(), iss.Name)
}
