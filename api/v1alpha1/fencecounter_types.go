package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FenceCounterSpec is the durable per-resource fence record. It lives in spec,
// not status, so that a backup/restore that drops status keeps it.
//
// +kubebuilder:validation:XValidation:rule="(has(self.fence) ? self.fence : 0) >= (has(oldSelf.fence) ? oldSelf.fence : 0)",message="FENCE_REGRESSION: fence never decreases"
// +kubebuilder:validation:XValidation:rule="!has(self.holder) || self.holder.fence <= (has(self.fence) ? self.fence : 0)",message="INVALID_SPEC: holder.fence cannot exceed fence"
type FenceCounterSpec struct {
	// resource is the fenced resource ID this counter belongs to: a
	// resource ID, or a slot of a resource with permits ("ID#k", see
	// LockGrantSpec.Permits). Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=203
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="INVALID_SPEC: resource is immutable"
	Resource string `json:"resource"`

	// fence is the highest fencing token ever issued for the resource. The
	// controller raises it by compare-and-swap when it grants; the API
	// server refuses any decrease, whoever asks (FENCE_REGRESSION, the
	// CRD's validation rule).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Fence int64 `json:"fence,omitempty"`

	// holder is the grant that was issued the current fence, while it may
	// still hold the resource. Unset when the resource is free.
	// +optional
	Holder *FenceHolder `json:"holder,omitempty"`

	// lockDelayUntil is set when the holder's lease ended without a release
	// and the holder asked for a lock-delay: the resource is not granted
	// again before this instant, by the controller's clock (RFC 3339, any
	// fraction of a second). Cleared by the next grant. A value the
	// controller cannot read keeps the resource from being granted until
	// it is corrected (fail closed).
	// +optional
	// +kubebuilder:validation:Format=date-time
	LockDelayUntil string `json:"lockDelayUntil,omitempty"`
}

// FenceHolder identifies one acquisition.
type FenceHolder struct {
	// name is the LockGrant's name, in the counter's namespace.
	// +required
	Name string `json:"name"`
	// uid is the LockGrant's UID, the owner token of the acquisition.
	// +required
	UID string `json:"uid"`
	// owner is the grant's owner identity.
	// +required
	Owner string `json:"owner"`
	// fence is the fencing token issued to this grant.
	// +required
	// +kubebuilder:validation:Minimum=1
	Fence int64 `json:"fence"`
	// lockDelaySeconds is the grant's lock-delay, kept here so that it
	// applies even when the grant itself is deleted while it holds.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	LockDelaySeconds int32 `json:"lockDelaySeconds,omitempty"`
	// expiresAt is the end of the holder's lease by the controller's clock
	// (RFC 3339, any fraction of a second), set when it is granted and
	// moved by every renew the controller applies. The counter carries the
	// live lease, so that the controller judges expiry and admission judges
	// a guarded write on this one object; the grant's status.expiresAt
	// mirrors it. A value that cannot be read counts as expired (fail
	// closed). Unset on counters written before it existed: the grant's
	// status is read then.
	// +optional
	// +kubebuilder:validation:Format=date-time
	ExpiresAt string `json:"expiresAt,omitempty"`
}

// FenceCounter records, for one resource ID in its namespace, the highest
// fencing token ever issued and the grant that holds it with its lease end:
// it is the holder of record. It is created and maintained by the controller
// (named FenceCounterName of the resource); nobody can lower it, and
// admission refuses to delete it while its namespace exists, since a new
// counter would issue fences again from the start.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=fc,categories=lockwarden
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resource`
// +kubebuilder:printcolumn:name="Fence",type=integer,JSONPath=`.spec.fence`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.spec.holder.name`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.holder.owner`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.spec.holder.expiresAt`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FenceCounter struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the fence record.
	// +required
	Spec FenceCounterSpec `json:"spec"`
}

// FenceCounterList is a list of FenceCounters.
//
// +kubebuilder:object:root=true
type FenceCounterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FenceCounter `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &FenceCounter{}, &FenceCounterList{})
}
