// Package v1alpha1 holds the locking.lockwarden.io/v1alpha1 API: LockGrant,
// one object per acquisition of a lease on a resource, and FenceCounter, the
// per-resource record of the highest fencing token ever issued.
//
// +kubebuilder:object:generate=true
// +groupName=locking.lockwarden.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "locking.lockwarden.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this API to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
