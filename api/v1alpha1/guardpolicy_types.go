package v1alpha1

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GuardPolicyMode is how a GuardPolicy enforces.
// +kubebuilder:validation:Enum=Shadow;Enforce
type GuardPolicyMode string

const (
	// ModeShadow admits every write, and records each write that Enforce
	// would deny: an Event, the metric
	// lockwarden_guardpolicy_shadow_denials_total and the annotation
	// locking.lockwarden.io/shadow-denial on the object. The first step of a
	// rollout.
	ModeShadow GuardPolicyMode = "Shadow"
	// ModeEnforce denies writes that fail the fencing checks.
	ModeEnforce GuardPolicyMode = "Enforce"
)

// Reasons of a GuardPolicy's Ready condition, and of the Events its
// webhook records.
const (
	// GuardPolicyReasonWebhookInstalled (Ready True): the policy's
	// admission webhook is installed in its mode.
	GuardPolicyReasonWebhookInstalled = "WebhookInstalled"
	// GuardPolicyReasonInvalidPolicy (Ready False): the policy could not be
	// installed (a bad selector, rule or holder list); the message names
	// the field (INVALID_POLICY).
	GuardPolicyReasonInvalidPolicy = "InvalidPolicy"
	// GuardPolicyReasonShadowDenied is the reason of the Warning Event a
	// policy in Shadow mode records on an object whose write Enforce would
	// have denied.
	GuardPolicyReasonShadowDenied = "ShadowDenied"
)

// GuardedResource is one API resource a policy guards.
type GuardedResource struct {
	// apiGroup is the API group, "" for the core group.
	// +optional
	APIGroup string `json:"apiGroup,omitempty"`
	// resource is the plural resource name, e.g. "configmaps".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	Resource string `json:"resource"`
}

// GuardPolicySpec selects guarded objects, maps each to a resource ID, and
// says who may hold grants for them and how strictly writes are checked.
type GuardPolicySpec struct {
	// resources are the API resources whose objects are guarded.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	Resources []GuardedResource `json:"resources"`

	// namespaces limits the policy to objects in these namespaces; empty
	// means every namespace.
	// +optional
	// +listType=set
	Namespaces []string `json:"namespaces,omitempty"`

	// selector limits the policy to objects with matching labels; empty
	// means every object of the resources.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// resourceIDTemplate maps an object to its resource ID. Empty: the
	// object's locking.lockwarden.io/resource annotation. Otherwise a
	// template in which "{namespace}" and "{name}" are replaced by the
	// object's, e.g. "settlements/{namespace}/{name}"; the result must be a
	// valid resource ID.
	// +optional
	// +kubebuilder:validation:MaxLength=200
	ResourceIDTemplate string `json:"resourceIDTemplate,omitempty"`

	// holders are the identities that may hold grants under this policy:
	// users, groups and service accounts.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	Holders []rbacv1.Subject `json:"holders"`

	// maxLeaseDurationSeconds bounds the TTL of grants under this policy,
	// in seconds; unset allows up to 3600.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	MaxLeaseDurationSeconds int32 `json:"maxLeaseDurationSeconds,omitempty"`

	// mode is Shadow (admit and record what Enforce would deny) or Enforce.
	// Roll out in Shadow first, then Enforce on one low-risk resource, then
	// widen.
	// +optional
	// +default="Shadow"
	Mode GuardPolicyMode `json:"mode,omitempty"`
}

// GuardPolicyStatus reports the policy's admission webhook.
type GuardPolicyStatus struct {
	// conditions holds Ready: whether the controller has done its part.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation the webhook configuration and
	// the revocations reflect.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// GuardPolicy guards objects selected by kind, namespace and labels, without
// labeling them: the controller installs an admission webhook for them. Its
// metadata.generation is the policyGeneration bound into grant records
// issued under it; when a change makes a Held grant no longer allowed, that
// grant is revoked (its fence stays consumed).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=gp,categories=lockwarden
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Generation",type=integer,JSONPath=`.metadata.generation`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GuardPolicy struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// spec is the policy.
	// +required
	Spec GuardPolicySpec `json:"spec"`
	// status is the controller's report.
	// +optional
	Status GuardPolicyStatus `json:"status,omitempty"`
}

// GuardPolicyList is a list of GuardPolicies.
//
// +kubebuilder:object:root=true
type GuardPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GuardPolicy `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &GuardPolicy{}, &GuardPolicyList{})
}
