package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultFenceIssuerName is the name of the one FenceIssuer the controller
// uses. It creates it, with epoch 0 and one signing key, when missing.
const DefaultFenceIssuerName = "default"

// Reasons of a FenceIssuer's Ready condition.
const (
	// FenceIssuerReasonPublished (Ready True): the controller holds every
	// listed key and published the trust bundle for the issuer's epoch.
	FenceIssuerReasonPublished = "Published"
)

// SigningKeyState is the life stage of a signing key.
// +kubebuilder:validation:Enum=Active;Verify;Retired
type SigningKeyState string

const (
	// KeyActive signs new grant records (exactly one key is Active) and verifies.
	KeyActive SigningKeyState = "Active"
	// KeyVerify no longer signs, but records it signed still verify.
	KeyVerify SigningKeyState = "Verify"
	// KeyRetired never verifies again: every record it signed is refused.
	KeyRetired SigningKeyState = "Retired"
)

// SigningKey names one Ed25519 key of the issuer. The private key lives in
// the Secret lockwarden-signing-keys in the manager's namespace; the
// controller generates it when the key is first listed.
type SigningKey struct {
	// keyID names the key: 1 to 32 lowercase letters, digits and "-".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	KeyID string `json:"keyID"`
	// state is Active, Verify or Retired. Rotation: list a new key as
	// Active and turn the old one to Verify; retire it once no record it
	// signed is needed any more.
	// +required
	State SigningKeyState `json:"state"`
}

// FenceIssuerSpec controls how grants are issued and verified cluster-wide.
//
// +kubebuilder:validation:XValidation:rule="(has(self.epoch) ? self.epoch : 0) >= (has(oldSelf.epoch) ? oldSelf.epoch : 0)",message="FENCE_REGRESSION: epoch never decreases"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.revokedEpochs) || oldSelf.revokedEpochs.all(e, has(self.revokedEpochs) && e in self.revokedEpochs)",message="FENCE_REGRESSION: a revoked epoch stays revoked"
// +kubebuilder:validation:XValidation:rule="!has(self.revokedEpochs) || self.revokedEpochs.all(e, e < (has(self.epoch) ? self.epoch : 0))",message="INVALID_SPEC: only epochs before the current epoch can be revoked"
// +kubebuilder:validation:XValidation:rule="self.signingKeys.filter(k, k.state == 'Active').size() == 1",message="INVALID_SPEC: exactly one signing key must be Active"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.signingKeys) || oldSelf.signingKeys.all(o, o.state != 'Retired' || self.signingKeys.exists(k, k.keyID == o.keyID && k.state == 'Retired'))",message="INVALID_SPEC: a retired key stays retired"
type FenceIssuerSpec struct {
	// epoch is the issuer epoch new grants are issued in. Every fence of a
	// later epoch is larger than every fence of an earlier one (a fence is
	// epoch<<40 | sequence). Raising it ends every Held grant of an earlier
	// epoch (phase Revoked). This is the recovery step after the registry
	// was restored from an old snapshot. Never decreases.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=8388607
	Epoch int64 `json:"epoch,omitempty"`

	// revokedEpochs are earlier epochs whose grants must never verify again:
	// enforcement points refuse their records with REVOKED_EPOCH and the
	// controller revokes their Held grants. Entries can only be added.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1024
	RevokedEpochs []int64 `json:"revokedEpochs,omitempty"`

	// signingKeys are the issuer's keys; exactly one is Active.
	// +required
	// +listType=map
	// +listMapKey=keyID
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	SigningKeys []SigningKey `json:"signingKeys"`
}

// FenceIssuerStatus reports what the controller published.
type FenceIssuerStatus struct {
	// conditions holds Ready: whether the controller has done its part.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// trustBundle is "NAMESPACE/NAME" of the ConfigMap holding the
	// published trust bundle (key trust-bundle.json).
	// +optional
	TrustBundle string `json:"trustBundle,omitempty"`
}

// FenceIssuer is the cluster-wide issuer configuration: the epoch fences are
// issued in, the revoked epochs, and the signing keys of grant records.
// Only the one named "default" is used.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=fi,categories=lockwarden
// +kubebuilder:printcolumn:name="Epoch",type=integer,JSONPath=`.spec.epoch`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Bundle",type=string,JSONPath=`.status.trustBundle`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FenceIssuer struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// spec is the issuer configuration.
	// +required
	Spec FenceIssuerSpec `json:"spec"`
	// status is what the controller published.
	// +optional
	Status FenceIssuerStatus `json:"status,omitempty"`
}

// FenceIssuerList is a list of FenceIssuers.
//
// +kubebuilder:object:root=true
type FenceIssuerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FenceIssuer `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &FenceIssuer{}, &FenceIssuerList{})
}
