package policy

import (
	"fmt"
	"strings"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Object is what the GuardPolicy rules read of a guarded object: where it
// lives and its annotations.
type Object struct {
	Namespace, Name string
	Annotations     map[string]string
}

// CheckBinding decides the resource a write under policy p is checked
// against: the resource ID of the stored object when there is one (stored
// not nil), else the written object's. A write that would change a stored
// object's resource ID is refused with BINDING_MISMATCH, and an object the
// policy maps to no valid resource ID with NO_RESOURCE. written is nil for
// a delete.
func CheckBinding(p *lockingv1alpha1.GuardPolicy, stored, written *Object) (string, error) {
	id := func(o *Object) string {
		if o == nil {
			return ""
		}
		return ResourceID(p, o.Namespace, o.Name, o.Annotations)
	}
	var resource string
	if stored != nil {
		resource = id(stored)
		if written != nil && resource != "" && id(written) != resource {
			return "", &fencing.Error{Reason: fencing.ReasonBindingMismatch, Detail: "the write would change the object's resource ID"}
		}
	} else {
		resource = id(written)
	}
	if resource == "" {
		return "", &fencing.Error{Reason: fencing.ReasonNoResource, Detail: fmt.Sprintf("GuardPolicy %q maps the object to no valid resource ID", p.Name)}
	}
	return resource, nil
}

// CheckOne refuses an object covered by more than one Enforce policy (pols)
// with BINDING_MISMATCH: each would map it to a resource and require proofs
// of its own.
func CheckOne(pols []*lockingv1alpha1.GuardPolicy) error {
	if len(pols) < 2 {
		return nil
	}
	names := make([]string, len(pols))
	for i, p := range pols {
		names[i] = p.Name
	}
	return &fencing.Error{Reason: fencing.ReasonBindingMismatch, Detail: fmt.Sprintf(
		"the object is covered by the Enforce GuardPolicies %s; a guarded object takes one policy: make their selectors disjoint", strings.Join(names, ", "))}
}
