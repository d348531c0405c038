// Package policy holds the pure rules of GuardPolicies: which objects a
// policy covers, the resource ID it maps an object to, and who may hold
// grants under it. The LockGrant webhook and controller and the guarded-write
// webhook all call it.
package policy

import (
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// AllowsHolder reports whether an identity (user name and groups) is among
// the policy's holders: a User subject by name, a Group subject by one of
// groups, a ServiceAccount subject by its system:serviceaccount:NS:NAME name.
func AllowsHolder(p *lockingv1alpha1.GuardPolicy, user string, groups []string) bool {
	for _, s := range p.Spec.Holders {
		switch s.Kind {
		case rbacv1.UserKind:
			if s.Name == user {
				return true
			}
		case rbacv1.GroupKind:
			if slices.Contains(groups, s.Name) {
				return true
			}
		case rbacv1.ServiceAccountKind:
			if "system:serviceaccount:"+s.Namespace+":"+s.Name == user {
				return true
			}
		}
	}
	return false
}

// AllowsTTL reports whether the policy allows a lease of ttl seconds.
func AllowsTTL(p *lockingv1alpha1.GuardPolicy, ttl int32) bool {
	return p.Spec.MaxLeaseDurationSeconds == 0 || ttl <= p.Spec.MaxLeaseDurationSeconds
}

// AllowsGrant reports why a grant by owner (with groups) for ttl seconds is
// not allowed under the policy, or "" when it is.
func AllowsGrant(p *lockingv1alpha1.GuardPolicy, owner string, groups []string, ttl int32) string {
	switch {
	case !AllowsHolder(p, owner, groups):
		return fmt.Sprintf("%q is not a holder of GuardPolicy %q", owner, p.Name)
	case !AllowsTTL(p, ttl):
		return fmt.Sprintf("GuardPolicy %q allows leases of at most %d seconds", p.Name, p.Spec.MaxLeaseDurationSeconds)
	}
	return ""
}

// Covers reports whether the policy covers an object of the given API group
// and resource in namespace ns with these labels.
func Covers(p *lockingv1alpha1.GuardPolicy, group, resource, ns string, objLabels map[string]string) (bool, error) {
	if !slices.ContainsFunc(p.Spec.Resources, func(r lockingv1alpha1.GuardedResource) bool {
		return r.APIGroup == group && r.Resource == resource
	}) {
		return false, nil
	}
	if len(p.Spec.Namespaces) > 0 && !slices.Contains(p.Spec.Namespaces, ns) {
		return false, nil
	}
	if p.Spec.Selector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil {
		return false, fmt.Errorf("GuardPolicy %q selector: %w", p.Name, err)
	}
	return sel.Matches(labels.Set(objLabels)), nil
}

// CoversAll reports whether the policy covers every object of the given API
// group and resource in namespace ns, whatever its labels: its selector, if
// any, selects everything.
func CoversAll(p *lockingv1alpha1.GuardPolicy, group, resource, ns string) (bool, error) {
	if p.Spec.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			return false, fmt.Errorf("GuardPolicy %q selector: %w", p.Name, err)
		}
		if !sel.Empty() {
			return false, nil
		}
	}
	return Covers(p, group, resource, ns, nil)
}

// ResourceID maps an object to its resource ID under the policy: the
// template with {namespace} and {name} replaced, or the object's resource
// annotation when the policy has no template. It returns "" when the object
// has no valid resource ID.
func ResourceID(p *lockingv1alpha1.GuardPolicy, ns, name string, annotations map[string]string) string {
	id := annotations[lockingv1alpha1.ResourceAnnotation]
	if t := p.Spec.ResourceIDTemplate; t != "" {
		id = strings.NewReplacer("{namespace}", ns, "{name}", name).Replace(t)
	}
	if !lockingv1alpha1.ValidResourceID(id) {
		return ""
	}
	return id
}

// Groups splits the owner-groups annotation of a LockGrant.
func Groups(g *lockingv1alpha1.LockGrant) []string {
	v := g.Annotations[lockingv1alpha1.OwnerGroupsAnnotation]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// Validate reports what makes a policy unusable, or nil: a label selector
// that does not parse, a resource ID template with anything but the
// placeholders {namespace} and {name} or that cannot yield a valid resource
// ID, or a holder that is not a User, Group or ServiceAccount with a name
// (and a namespace, for a ServiceAccount). It is Fields as one error.
func Validate(p *lockingv1alpha1.GuardPolicy) error {
	return Fields(p).ToAggregate()
}

// Fields returns the fields that make a policy unusable, each naming the
// user's field (see Validate); empty when it is usable.
func Fields(p *lockingv1alpha1.GuardPolicy) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if p.Spec.Selector != nil {
		if _, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err != nil {
			errs = append(errs, field.Invalid(spec.Child("selector"), p.Spec.Selector, err.Error()))
		}
	}
	if t := p.Spec.ResourceIDTemplate; t != "" {
		rest := strings.NewReplacer("{namespace}", "", "{name}", "").Replace(t)
		// Namespaces and most names are lowercase DNS labels; the result
		// must then be a valid resource ID.
		sample := strings.NewReplacer("{namespace}", "billing", "{name}", "settlement-7").Replace(t)
		switch {
		case strings.ContainsAny(rest, "{}"):
			errs = append(errs, field.Invalid(spec.Child("resourceIDTemplate"), t, "only {namespace} and {name} may be used"))
		case !lockingv1alpha1.ValidResourceID(sample):
			errs = append(errs, field.Invalid(spec.Child("resourceIDTemplate"), t, fmt.Sprintf(
				"yields %q for namespace billing and name settlement-7, which is not a valid resource ID (%s)", sample, lockingv1alpha1.ResourcePattern)))
		}
	}
	for i, h := range p.Spec.Holders {
		path := spec.Child("holders").Index(i)
		switch {
		case h.Name == "":
			errs = append(errs, field.Required(path.Child("name"), "a holder needs a name"))
		case h.Kind == rbacv1.ServiceAccountKind && h.Namespace == "":
			errs = append(errs, field.Required(path.Child("namespace"), "a ServiceAccount needs a namespace"))
		case h.Kind != rbacv1.UserKind && h.Kind != rbacv1.GroupKind && h.Kind != rbacv1.ServiceAccountKind:
			errs = append(errs, field.NotSupported(path.Child("kind"), h.Kind, []string{rbacv1.UserKind, rbacv1.GroupKind, rbacv1.ServiceAccountKind}))
		}
	}
	return errs
}

// Refusals is Fields with every detail starting with INVALID_POLICY: the
// refusal of an unusable policy, empty when it is usable.
func Refusals(p *lockingv1alpha1.GuardPolicy) field.ErrorList {
	errs := Fields(p)
	for _, e := range errs {
		e.Detail = string(fencing.ReasonInvalidPolicy) + ": " + e.Detail
	}
	return errs
}
