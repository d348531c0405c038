// Package lockgrant is the admission webhook of LockGrants: it binds each
// grant to the identity that created it and lets only that identity renew
// or release it, through the rules in pkg/fencing.
package lockgrant

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/facts"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Defaulter fills in what the API server knows and the client must not
// choose: the owner (the authenticated requester, when empty), the request
// time, and the request-ID label.
type Defaulter struct {
	Clock clock.PassiveClock
}

var _ admission.Defaulter[*lockingv1alpha1.LockGrant] = &Defaulter{}

// NewDefaulter returns the mutating webhook of LockGrants.
func NewDefaulter(s *runtime.Scheme, clk clock.PassiveClock) *admission.Webhook {
	return admission.WithDefaulter(s, &Defaulter{Clock: clk})
}

// Default implements admission.Defaulter.
func (d *Defaulter) Default(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return err
	}
	if g.Spec.RequestID != "" {
		if g.Labels == nil {
			g.Labels = map[string]string{}
		}
		g.Labels[lockingv1alpha1.RequestIDLabel] = g.Spec.RequestID
	}
	if req.Operation != "CREATE" {
		return nil
	}
	if g.Spec.RequestID != "" && g.Name == "" {
		// Named after the request ID, so that a retried create of the same
		// request fails with AlreadyExists instead of queuing twice.
		g.Name = lockingv1alpha1.GrantNameForRequest(g.Spec.RequestID)
	}
	if g.Spec.Owner == "" {
		g.Spec.Owner = req.UserInfo.Username
	}
	if g.Annotations == nil {
		g.Annotations = map[string]string{}
	}
	g.Annotations[lockingv1alpha1.RequestedAtAnnotation] = d.Clock.Now().UTC().Format(time.RFC3339Nano)
	return nil
}

// Validator refuses a spoofed owner and any renew or release that is not
// the owner's or that the grant's state does not allow.
type Validator struct {
	Clock clock.PassiveClock
}

var _ admission.Validator[*lockingv1alpha1.LockGrant] = &Validator{}

// NewValidator returns the validating webhook of LockGrants.
func NewValidator(s *runtime.Scheme, clk clock.PassiveClock) *admission.Webhook {
	return admission.WithValidator(s, &Validator{Clock: clk})
}

// ValidateCreate checks that the owner is the requester and that the
// request starts fresh.
func (v *Validator) ValidateCreate(ctx context.Context, g *lockingv1alpha1.LockGrant) (admission.Warnings, error) {
	user, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	if g.Spec.Owner != user {
		return nil, deny(g.Name, &fencing.Error{Reason: fencing.ReasonNotOwner,
			Detail: fmt.Sprintf("spec.owner %q must be the requesting user %q (leave it empty to default it)", g.Spec.Owner, user)})
	}
	if g.Spec.Renewals != 0 || g.Spec.Release {
		return nil, apierrors.NewBadRequest("a new LockGrant must have spec.renewals 0 and spec.release false")
	}
	if g.Spec.RequestID != "" {
		if want := lockingv1alpha1.GrantNameForRequest(g.Spec.RequestID); g.Name != want {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("a LockGrant with requestID %q must be named %q (or use generateName)", g.Spec.RequestID, want))
		}
	}
	return nil, nil
}

// ValidateUpdate lets the owner renew (raise spec.renewals) or release (set
// spec.release) while fencing.CheckRenew / fencing.CheckRelease allow it.
// Once a grant has ended, its owner cannot change it any more: a late renew
// or a retried release is refused with the reason the grant ended. Changes
// by other identities to spec are refused with NOT_OWNER.
func (v *Validator) ValidateUpdate(ctx context.Context, oldG, newG *lockingv1alpha1.LockGrant) (admission.Warnings, error) {
	user, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	if oldG.Annotations[lockingv1alpha1.RequestedAtAnnotation] != newG.Annotations[lockingv1alpha1.RequestedAtAnnotation] {
		return nil, apierrors.NewBadRequest("annotation " + lockingv1alpha1.RequestedAtAnnotation + " is immutable")
	}
	now := v.Clock.Now()
	g := *facts.Grant(oldG)
	renew := newG.Spec.Renewals > oldG.Spec.Renewals
	release := newG.Spec.Release
	specChanged := renew || newG.Spec.Release != oldG.Spec.Release
	switch {
	case !specChanged && user != g.Owner:
		return nil, nil // metadata of someone else's grant: RBAC decides.
	case !specChanged && !oldG.Status.Phase.Final():
		return nil, nil
	case renew:
		return nil, deny(newG.Name, fencing.CheckRenew(g, user, now))
	case release:
		return nil, deny(newG.Name, fencing.CheckRelease(g, user, now))
	}
	return nil, nil
}

// ValidateDelete allows deletion; RBAC decides who may delete.
func (v *Validator) ValidateDelete(context.Context, *lockingv1alpha1.LockGrant) (admission.Warnings, error) {
	return nil, nil
}

func requester(ctx context.Context) (string, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return "", err
	}
	return req.UserInfo.Username, nil
}

// deny turns a fencing refusal into a Forbidden admission error whose
// message starts with the reason code.
func deny(name string, err error) error {
	if err == nil {
		return nil
	}
	return apierrors.NewForbidden(lockingv1alpha1.GroupVersion.WithResource("lockgrants").GroupResource(), name, err)
}
