package policy

import (
	"fmt"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// CheckGrant reports whether a grant request by owner (with groups) for a
// lease of ttl seconds may name policy p: NOT_OWNER when owner is not among
// its holders, INVALID_SPEC (about spec.leaseDurationSeconds) when the
// lease is longer than the policy allows.
func CheckGrant(p *lockingv1alpha1.GuardPolicy, owner string, groups []string, ttl int32) error {
	switch {
	case !AllowsHolder(p, owner, groups):
		return &fencing.Error{Reason: fencing.ReasonNotOwner, Detail: fmt.Sprintf("%q is not a holder of GuardPolicy %q", owner, p.Name)}
	case !AllowsTTL(p, ttl):
		return &fencing.Error{Reason: fencing.ReasonInvalidSpec, Detail: fmt.Sprintf("GuardPolicy %q allows leases of at most %d seconds", p.Name, p.Spec.MaxLeaseDurationSeconds)}
	}
	return nil
}
