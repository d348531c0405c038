package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RequestIDLedgerName is the name of the one RequestIDLedger of a
// namespace.
const RequestIDLedgerName = "spent-request-ids"

// MaxSpentRequestIDs is how many request IDs one RequestIDLedger holds: at
// most about 150 bytes each, well within the API server's limit on an
// object's size.
const MaxSpentRequestIDs = 5000

// RequestIDLedgerSpec lists the spent request IDs of a namespace whose
// grants have been deleted.
type RequestIDLedgerSpec struct {
	// entries are the spent request IDs, one entry per ID.
	// +optional
	// +listType=map
	// +listMapKey=requestID
	// +kubebuilder:validation:MaxItems=5000
	Entries []SpentRequestID `json:"entries,omitempty"`
}

// SpentRequestID is one request ID whose grant ended and was deleted.
type SpentRequestID struct {
	// requestID is the request ID (LockGrantSpec.RequestID).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	RequestID string `json:"requestID"`
	// phase is the phase its grant ended in: Released, Expired, TimedOut
	// or Revoked.
	// +required
	Phase LockGrantPhase `json:"phase"`
	// endedAt is when its grant ended, by the controller's clock.
	// +required
	EndedAt metav1.Time `json:"endedAt"`
	// spentUntil is the end of the window in which a new LockGrant with
	// this request ID is refused, by the controller's clock: endedAt plus
	// the manager's --request-id-window. For as long again after it, a new
	// grant with the ID is admitted with a warning and marked
	// (ReusedRequestIDAnnotation); then the entry is removed.
	// +required
	SpentUntil metav1.Time `json:"spentUntil"`
}

// RequestIDLedger remembers the request IDs of a namespace whose grants
// ended and were deleted, so that a request ID stays spent for a stated
// window however long finished grants are kept: the controller records
// each ID here before it deletes the grant, and admission refuses a new
// LockGrant with an ID the ledger holds within its window, with the reason
// the earlier grant ended (ALREADY_ENDED, EXPIRED, REVOKED). IDs the holder
// library generated itself (annotation GeneratedRequestIDAnnotation) are
// never recorded: nobody else can reuse them. There is one ledger per
// namespace, named RequestIDLedgerName, written only by the controller.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=lockwarden
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RequestIDLedger struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec holds the spent request IDs.
	// +optional
	Spec RequestIDLedgerSpec `json:"spec,omitzero"`
}

// RequestIDLedgerList is a list of RequestIDLedgers.
//
// +kubebuilder:object:root=true
type RequestIDLedgerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RequestIDLedger `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &RequestIDLedger{}, &RequestIDLedgerList{})
}
