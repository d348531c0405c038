// Package v1alpha1 holds the locking.lockwarden.io/v1alpha1 API: LockGrant,
// one object per acquisition of a lease on a resource; FenceCounter, the
// per-resource record of the highest fencing token ever issued; FenceIssuer
// (cluster-scoped, one per cluster), the issuer's epoch, signing keys and
// revoked epochs; and GuardPolicy (cluster-scoped), which guards the writes
// of the objects it selects. It also names the well-known labels,
// annotations and webhook paths clients and the manager share.
//
// +kubebuilder:object:generate=true
// +groupName=locking.lockwarden.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "locking.lockwarden.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a runtime.Scheme.
	// It depends on k8s.io/apimachinery only, so that importing the API
	// does not pull in controller-runtime.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this API to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// knownTypes are the kinds of this API and their lists.
var knownTypes []runtime.Object

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, knownTypes...)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
