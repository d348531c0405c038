package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Bounds of LockGrantSpec fields. They are enforced by the CRD schema.
const (
	// MaxResourceLength is the longest resource ID, in bytes.
	MaxResourceLength = 200
	// MinLeaseDurationSeconds is the shortest lease, in seconds.
	MinLeaseDurationSeconds = 1
	// MaxLeaseDurationSeconds is the longest lease, in seconds (one hour).
	MaxLeaseDurationSeconds = 3600
	// MaxWaitTimeoutSeconds is the longest wait limit, in seconds (one day).
	MaxWaitTimeoutSeconds = 86400
	// MaxLockDelaySeconds is the longest lock-delay, in seconds (one hour).
	MaxLockDelaySeconds = 3600
	// MaxPermits is the largest number of permits of a resource: its slots
	// are numbered 0 to MaxPermits-1.
	MaxPermits = 64
)

// LockGrantSpec is an acquisition request: who wants which resource, for how
// long each lease lasts, and, later, the owner's renewals and release.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.owner) || (has(self.owner) && self.owner == oldSelf.owner)",message="INVALID_SPEC: owner is immutable",fieldPath=".owner"
// +kubebuilder:validation:XValidation:rule="(has(self.waitTimeoutSeconds) ? self.waitTimeoutSeconds : 0) == (has(oldSelf.waitTimeoutSeconds) ? oldSelf.waitTimeoutSeconds : 0)",message="INVALID_SPEC: waitTimeoutSeconds is immutable",fieldPath=".waitTimeoutSeconds"
// +kubebuilder:validation:XValidation:rule="(has(self.lockDelaySeconds) ? self.lockDelaySeconds : 0) == (has(oldSelf.lockDelaySeconds) ? oldSelf.lockDelaySeconds : 0)",message="INVALID_SPEC: lockDelaySeconds is immutable",fieldPath=".lockDelaySeconds"
// +kubebuilder:validation:XValidation:rule="has(self.requestID) == has(oldSelf.requestID) && (!has(self.requestID) || self.requestID == oldSelf.requestID)",message="INVALID_SPEC: requestID is immutable",fieldPath=".requestID"
// +kubebuilder:validation:XValidation:rule="(has(self.renewals) ? self.renewals : 0) >= (has(oldSelf.renewals) ? oldSelf.renewals : 0)",message="INVALID_SPEC: renewals never decreases",fieldPath=".renewals"
// +kubebuilder:validation:XValidation:rule="(has(self.renewals) ? self.renewals : 0) <= (has(oldSelf.renewals) ? oldSelf.renewals : 0) + 1",message="INVALID_SPEC: renewals rises by one per renew",fieldPath=".renewals"
// +kubebuilder:validation:XValidation:rule="has(self.operationRoot) == has(oldSelf.operationRoot) && (!has(self.operationRoot) || self.operationRoot == oldSelf.operationRoot)",message="INVALID_SPEC: operationRoot is immutable",fieldPath=".operationRoot"
// +kubebuilder:validation:XValidation:rule="has(self.operationClass) == has(oldSelf.operationClass) && (!has(self.operationClass) || self.operationClass == oldSelf.operationClass)",message="INVALID_SPEC: operationClass is immutable",fieldPath=".operationClass"
// +kubebuilder:validation:XValidation:rule="has(self.policy) == has(oldSelf.policy) && (!has(self.policy) || self.policy == oldSelf.policy)",message="INVALID_SPEC: policy is immutable",fieldPath=".policy"
// +kubebuilder:validation:XValidation:rule="has(self.session) == has(oldSelf.session) && (!has(self.session) || self.session == oldSelf.session)",message="INVALID_SPEC: session is immutable",fieldPath=".session"
// +kubebuilder:validation:XValidation:rule="!(has(oldSelf.release) && oldSelf.release) || (has(self.release) && self.release)",message="INVALID_SPEC: release cannot be unset",fieldPath=".release"
// +kubebuilder:validation:XValidation:rule="(has(self.permits) ? self.permits : 1) == (has(oldSelf.permits) ? oldSelf.permits : 1)",message="INVALID_SPEC: permits is immutable",fieldPath=".permits"
type LockGrantSpec struct {
	// resource is the canonical ID of the protected resource, for example
	// "invoice-batch/2026-07-19". It is one or more segments separated by "/";
	// a segment is lowercase letters, digits, ".", "_" and "-", starting and
	// ending with a letter or digit. At most 200 bytes. Resource IDs are scoped
	// to the LockGrant's namespace. Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="INVALID_SPEC: resource is immutable"
	Resource string `json:"resource"`

	// owner is the workload identity that holds the grant: the Kubernetes user
	// name of the requester, for example
	// "system:serviceaccount:billing:settlement-7". Admission sets it to the
	// authenticated requester when empty and refuses any other value (NOT_OWNER).
	// Only the owner may renew or release. Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Owner string `json:"owner,omitempty"`

	// leaseDurationSeconds is the server-side TTL of the lease, in seconds,
	// from 1 to 3600. A grant expires leaseDurationSeconds after it was granted
	// or last renewed, judged by the controller's clock. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 3600",message="INVALID_SPEC: leaseDurationSeconds must be from 1 to 3600"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="INVALID_SPEC: leaseDurationSeconds is immutable"
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds"`

	// waitTimeoutSeconds is how long, in seconds, this request may wait in the
	// queue, counted from its admission. A waiter whose limit has passed ends
	// as TimedOut and is never granted later. 0 or unset waits without limit;
	// at most 86400. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 0 && self <= 86400",message="INVALID_SPEC: waitTimeoutSeconds must be from 0 to 86400"
	WaitTimeoutSeconds int32 `json:"waitTimeoutSeconds,omitempty"`

	// lockDelaySeconds is this grant's lock-delay, in seconds: when its lease
	// ends without a release (it expired, its session lapsed, it was revoked
	// or its grant was deleted), the resource is not granted again for this
	// long, so that effects the lost holder still has in flight on a
	// resource that cannot check a fence (an external API, a file on a
	// share) can drain. A release ends the grant without a delay. The delay
	// is judged by the controller's clock, like the lease. 0 or unset: none;
	// at most 3600. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 0 && self <= 3600",message="INVALID_SPEC: lockDelaySeconds must be from 0 to 3600"
	LockDelaySeconds int32 `json:"lockDelaySeconds,omitempty"`

	// requestID is the client's idempotency key for this acquisition: 1 to 63
	// letters, digits, ".", "_" or "-", starting and ending with a letter or
	// digit. Admission copies it to the label locking.lockwarden.io/request-id
	// so that a client whose create response was lost finds its grant by
	// request ID instead of creating a second one. Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`
	RequestID string `json:"requestID,omitempty"`

	// operationRoot binds the grant to one operation: the sha256 digest of
	// the operation's description, as "sha256:" and 64 lowercase hex
	// digits, chosen by the requester. It goes into the signed grant record,
	// and enforcement points that are told the root of a write refuse a
	// grant of another root. Immutable.
	// +optional
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	OperationRoot string `json:"operationRoot,omitempty"`

	// operationClass names the kind of operation, e.g. "settlement"; up to
	// 63 lowercase letters, digits and "-". Recorded in the grant record.
	// Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	OperationClass string `json:"operationClass,omitempty"`

	// policy is the name of the GuardPolicy this grant is requested under.
	// Writes to objects that a policy covers must carry a grant issued
	// under that policy. Admission refuses the request unless the policy
	// exists, lists the requester among its holders and allows the lease
	// duration; if the policy later stops allowing the grant, the grant is
	// Revoked. Immutable.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Policy string `json:"policy,omitempty"`

	// renewals counts the renewals the owner has asked for. To renew, the
	// owner raises it by exactly one (a larger jump is refused); the controller then extends expiresAt to its
	// clock's now plus leaseDurationSeconds, if the grant is still Held and
	// unexpired, and reports the outcome in status.observedRenewals and the
	// Renewed condition. A renew of an expired grant fails and never
	// re-acquires. It never decreases and starts at 0.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Renewals int64 `json:"renewals,omitempty"`

	// session ties the request to the liveness of its client process: a
	// coordination.k8s.io/v1 Lease in the same namespace, labeled
	// locking.lockwarden.io/session=true, whose spec.holderIdentity is the
	// owner, that the client renews while it runs. A Pending request whose
	// session is gone or lapsed is withdrawn (Released, reason
	// SessionExpired) and never granted; a Held grant whose session lapsed
	// ends as Expired (reason SessionExpired). A session lapses when the
	// controller has seen no change to the Lease for its
	// spec.leaseDurationSeconds plus a margin of one second, by the
	// controller's clock. Unset: the request has no liveness beyond its
	// wait limit and its lease. Immutable.
	// +optional
	Session *SessionRef `json:"session,omitempty"`

	// permits is the number of holders the resource admits at once, from 1
	// to 64: a resource with N permits is N exclusive slots, numbered 0 to
	// N-1, sharing one FIFO queue. The grant holds one slot below its own
	// permits (status.permit), so that an exclusive request only ever
	// holds slot 0, and each slot has its own fence sequence and its own
	// fenced resource ID (status.fencedResource): slot 0 is the resource
	// ID itself, slot k>0 is the resource ID followed by "#k". Guarded
	// objects and store rows bound to a slot accept only that slot's
	// fences, so every fencing rule of an exclusive lock holds per slot.
	// The limit in force for a resource is the permits of its most
	// recently requested live grant: every request for a resource should
	// name the same permits, and a new value takes effect with the
	// requests that name it. Lowering it never ends a live grant: holders
	// beyond the new limit keep their slot until they release or expire
	// (their WithinLimit condition is False, reason OverLimit), and nobody
	// is granted while as many grants as the limit hold. 0 or unset means
	// 1, an exclusive lock. See docs/semaphores.md. Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 64",message="INVALID_SPEC: permits must be from 1 to 64"
	Permits int32 `json:"permits,omitempty"`

	// release set to true by the owner ends the grant: a Held grant becomes
	// Released, a Pending one leaves the queue. It cannot be unset.
	// +optional
	Release bool `json:"release,omitempty"`
}

// SessionRef names the session Lease of a request's client.
type SessionRef struct {
	// name is the name of the coordination.k8s.io/v1 Lease, in the
	// LockGrant's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// uid is the Lease's metadata.uid, so that a Lease deleted and created
	// again under the same name is another session.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	UID string `json:"uid"`
}

// LockGrantPhase is where a grant is in its life.
// +kubebuilder:validation:Enum=Pending;Held;Expired;Released;TimedOut;Revoked
type LockGrantPhase string

const (
	// PhasePending means the request waits in the resource's FIFO queue.
	PhasePending LockGrantPhase = "Pending"
	// PhaseHeld means the grant holds the resource until status.expiresAt.
	PhaseHeld LockGrantPhase = "Held"
	// PhaseExpired means the lease ran out (at expiresAt, equality included)
	// or a renew arrived after it had. Final.
	PhaseExpired LockGrantPhase = "Expired"
	// PhaseReleased means the owner released the grant, or withdrew the
	// request before it was granted. Final.
	PhaseReleased LockGrantPhase = "Released"
	// PhaseTimedOut means the request's wait limit passed before it was
	// granted. Final: it is never granted later.
	PhaseTimedOut LockGrantPhase = "TimedOut"
	// PhaseRevoked means the grant was ended by the issuer before its
	// lease ran out: its issuer epoch was revoked or superseded, or its
	// GuardPolicy no longer allows it. Its fence stays consumed. Final.
	PhaseRevoked LockGrantPhase = "Revoked"
)

// LockGrantPhases returns every phase of a LockGrant, in the order of its
// life: the CRD's enum (TestMarkersMatchConstants keeps the two in
// agreement), and the values clients such as kubectl lockwarden accept.
// The slice is the caller's.
func LockGrantPhases() []LockGrantPhase {
	return []LockGrantPhase{PhasePending, PhaseHeld, PhaseExpired, PhaseReleased, PhaseTimedOut, PhaseRevoked}
}

// Final reports whether the phase can never change again.
func (p LockGrantPhase) Final() bool {
	switch p {
	case PhaseExpired, PhaseReleased, PhaseTimedOut, PhaseRevoked:
		return true
	}
	return false
}

// Condition types of a LockGrant. ConditionReady is also the one
// condition of a FenceIssuer and of a GuardPolicy.
const (
	// ConditionReady is True while the grant is Held, and says why not
	// otherwise (reason Pending, Expired, Released, TimedOut, ...).
	ConditionReady = "Ready"
	// ConditionRenewed reports the outcome of the owner's last renew
	// (reason Renewed, Expired or AlreadyEnded).
	ConditionRenewed = "Renewed"
	// ConditionWithinLimit is False (reason OverLimit) on a Held grant whose
	// slot is no longer below the resource's limit of permits, or that holds
	// while more grants hold than the limit allows: the limit was lowered
	// after it was granted. The grant keeps its slot and its fence until it
	// ends; it is True again once the limit covers it.
	ConditionWithinLimit = "WithinLimit"
	// ConditionFenceRegression is True when a protected resource refused
	// the grant's writes with FENCE_REGRESSION (reported by the holder in
	// the annotation locking.lockwarden.io/fence-regression): the registry
	// reissued a fence. Recover by bumping the issuer epoch.
	ConditionFenceRegression = "FenceRegression"
)

// Reasons of a LockGrant's conditions and of the Events the controller
// records about it, in CamelCase as Kubernetes API conventions ask. A
// reason that stands for a refusal of the fencing catalog is that code's
// ConditionReason (Expired for EXPIRED, RevokedEpoch for REVOKED_EPOCH), so
// that users see the same word everywhere; metric labels carry the code
// itself (fencing.CodeOf).
const (
	// LockGrantReasonPending (Ready False): the request waits in the
	// resource's FIFO queue.
	LockGrantReasonPending = "Pending"
	// LockGrantReasonLockDelay (Ready False): the request is next in line
	// and waits out the lock-delay of a holder whose lease ended without a
	// release.
	LockGrantReasonLockDelay = "LockDelay"
	// LockGrantReasonSequenceExhausted (Ready False): the request is next in
	// line, and the resource's fences of the issuer's epoch are used up: it
	// is granted once the issuer's epoch is raised (SEQUENCE_EXHAUSTED).
	LockGrantReasonSequenceExhausted = "SequenceExhausted"
	// LockGrantReasonEpochBehind (Ready False): the request is next in line,
	// and the resource recorded a fence of a later epoch than the issuer's:
	// it is granted once the issuer's epoch is raised to that epoch
	// (EPOCH_BEHIND).
	LockGrantReasonEpochBehind = "EpochBehind"
	// LockGrantReasonGranted (Ready True, and an Event): the grant is Held
	// with its fence.
	LockGrantReasonGranted = "Granted"
	// LockGrantReasonRenewed (Renewed True): the owner's last renew
	// extended the lease.
	LockGrantReasonRenewed = "Renewed"
	// LockGrantReasonAlreadyEnded (Renewed False): a renew met the grant's
	// release (ALREADY_ENDED).
	LockGrantReasonAlreadyEnded = "AlreadyEnded"
	// LockGrantReasonReleased (Ready False, phase Released): the owner
	// released the grant.
	LockGrantReasonReleased = "Released"
	// LockGrantReasonCancelled (Ready False, phase Released): the owner
	// withdrew the request before it was granted.
	LockGrantReasonCancelled = "Cancelled"
	// LockGrantReasonTimedOut (Ready False, phase TimedOut): the request's
	// wait limit passed before it was granted (TIMED_OUT).
	LockGrantReasonTimedOut = "TimedOut"
	// LockGrantReasonExpired (Ready False with phase Expired, or Renewed
	// False): the lease ran out, or a renew arrived after it had (EXPIRED).
	LockGrantReasonExpired = "Expired"
	// LockGrantReasonSuperseded (Ready False, phase Expired): the
	// resource's FenceCounter names another holder.
	LockGrantReasonSuperseded = "Superseded"
	// LockGrantReasonSessionExpired (Ready False, phase Expired or
	// Released): the session Lease the request names is gone or lapsed; a
	// waiting request is withdrawn, a Held grant ends (SESSION_EXPIRED).
	LockGrantReasonSessionExpired = "SessionExpired"
	// LockGrantReasonRevokedEpoch (Ready False, phase Revoked): the grant's
	// issuer epoch was revoked or superseded (REVOKED_EPOCH).
	LockGrantReasonRevokedEpoch = "RevokedEpoch"
	// LockGrantReasonPolicyDenied (Ready False, phase Revoked): the grant's
	// GuardPolicy is gone or no longer allows it.
	LockGrantReasonPolicyDenied = "PolicyDenied"
	// LockGrantReasonFenceRegression (FenceRegression True, and a Warning
	// Event): a protected resource refused the grant's fence as reissued
	// (FENCE_REGRESSION).
	LockGrantReasonFenceRegression = "FenceRegression"
	// LockGrantReasonOverLimit (WithinLimit False): the Held grant's slot
	// is no longer below the resource's limit of permits, which was lowered
	// after it was granted. It keeps its slot and its fence.
	LockGrantReasonOverLimit = "OverLimit"
	// LockGrantReasonWithinLimit (WithinLimit True): the limit covers the
	// grant's slot again.
	LockGrantReasonWithinLimit = "WithinLimit"
)

// LockGrantStatus is written only by the lockwarden controller. The API
// server keeps a status that lands late (decided on an older fence record,
// or sent before a newer one by another replica) from replacing a newer
// one: a final phase, with its end and lease end, an issued fence and a
// published record (proof and record) never change, and counterGeneration
// (unset reads as 0) never decreases while the fence stays.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phase) || !(oldSelf.phase in ['Expired', 'Released', 'TimedOut', 'Revoked']) || (has(self.phase) && self.phase == oldSelf.phase)",message="ALREADY_ENDED: a final phase never changes"
// +kubebuilder:validation:XValidation:rule="(has(oldSelf.fenceToken) ? oldSelf.fenceToken : 0) == 0 || (has(self.fenceToken) ? self.fenceToken : 0) == oldSelf.fenceToken",message="FENCE_REGRESSION: a grant's fence never changes once issued"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.proof) || (has(self.proof) && self.proof == oldSelf.proof)",message="FENCE_REGRESSION: a published record never changes"
// +kubebuilder:validation:XValidation:rule="((has(self.fenceToken) ? self.fenceToken : 0) == 0) != ((has(oldSelf.fenceToken) ? oldSelf.fenceToken : 0) == 0) || (has(self.counterGeneration) ? self.counterGeneration : 0) >= (has(oldSelf.counterGeneration) ? oldSelf.counterGeneration : 0)",message="FENCE_REGRESSION: counterGeneration never decreases while the fence stays"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.record) || (has(self.record) && self.record == oldSelf.record)",message="FENCE_REGRESSION: a published record never changes"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.phase) || !(oldSelf.phase in ['Expired', 'Released', 'TimedOut', 'Revoked']) || (has(self.endedAt) == has(oldSelf.endedAt) && (!has(self.endedAt) || self.endedAt == oldSelf.endedAt) && has(self.expiresAt) == has(oldSelf.expiresAt) && (!has(self.expiresAt) || self.expiresAt == oldSelf.expiresAt))",message="ALREADY_ENDED: a final grant's end and lease end never change"
type LockGrantStatus struct {
	// conditions are Ready, Renewed, WithinLimit and FenceRegression.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// phase is Pending, Held, Expired, Released, TimedOut or Revoked.
	// +optional
	Phase LockGrantPhase `json:"phase,omitempty"`

	// fenceToken is the fencing token of this grant: strictly larger than
	// every token issued before for the same fenced resource (the slot,
	// status.fencedResource), never reused, and unchanged by renewals. 0
	// until the grant is Held.
	// +optional
	// +kubebuilder:validation:Minimum=0
	FenceToken int64 `json:"fenceToken,omitempty"`

	// permit is the slot a Held grant holds, from 0 to 63. Set when the
	// grant becomes Held and never changed after; kept when it ends. Unset
	// for slot 0 of a grant that asks for one permit, whose status stays
	// that of an exclusive lock: read unset as slot 0 (LockGrant.HeldSlot).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=63
	Permit *int32 `json:"permit,omitempty"`

	// fencedResource is the fenced resource ID of the slot the grant holds:
	// spec.resource for slot 0, spec.resource + "#k" for slot k. Its
	// fenceToken belongs to this ID's fence sequence, the signed record
	// names it, and guarded objects and store rows bound to it accept the
	// grant's writes. Set with permit; unset means spec.resource
	// (LockGrant.HeldFencedResource).
	// +optional
	// +kubebuilder:validation:MaxLength=203
	FencedResource string `json:"fencedResource,omitempty"`

	// queuePosition is the number of requests that were ahead of this one
	// when it joined the queue, and 0 once it is next in line. It is not
	// rewritten while requests ahead leave, so that a handoff costs the
	// same writes whatever the queue's length; `kubectl lockwarden status`
	// shows every waiter's live position. Unset in every other phase.
	// +optional
	// +kubebuilder:validation:Minimum=0
	QueuePosition *int32 `json:"queuePosition,omitempty"`

	// grantedAt is when the grant became Held, by the controller's clock.
	// +optional
	GrantedAt *metav1.MicroTime `json:"grantedAt,omitempty"`

	// expiresAt is when the lease ends, by the controller's clock: at this
	// instant and after, the grant is expired.
	// +optional
	ExpiresAt *metav1.MicroTime `json:"expiresAt,omitempty"`

	// lastRenewTime is when the controller applied the last successful renew.
	// +optional
	LastRenewTime *metav1.MicroTime `json:"lastRenewTime,omitempty"`

	// endedAt is when the grant reached a final phase.
	// +optional
	EndedAt *metav1.MicroTime `json:"endedAt,omitempty"`

	// counterGeneration is the metadata.generation of the FenceCounter
	// this status was decided on: the counter of the slot the grant holds
	// or held, the resource's own (slot 0) while it waits. Every change of
	// holder or lease raises it, so a status decided on an older fence
	// record than the one it would replace is refused. 0 (unset) on a
	// status written by an earlier version, or before the resource had a
	// counter.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CounterGeneration int64 `json:"counterGeneration,omitempty"`

	// observedRenewals is the spec.renewals value the controller has
	// answered, successfully or not.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedRenewals int64 `json:"observedRenewals,omitempty"`

	// record is the signed grant record (lockGrant.v1), published when the
	// grant becomes Held and never changed after. See docs/grant-record.md.
	// +optional
	Record *GrantRecord `json:"record,omitempty"`

	// proof is the record in its compact signed form, "lgv1.<record>.<signature>":
	// what a guarded write carries in the annotation
	// locking.lockwarden.io/proof and what any verifier checks with the
	// issuer's trust bundle.
	// +optional
	Proof string `json:"proof,omitempty"`
}

// GrantRecord is the lockGrant.v1 record of a Held grant; every field is
// covered by the signature in status.proof (docs/grant-record.md).
type GrantRecord struct {
	// schema is "lockGrant.v1".
	// +required
	Schema string `json:"schema"`
	// resource is the fenced resource ID: the resource ID for an exclusive
	// lock and for slot 0 of a resource with permits, the resource ID
	// followed by "#k" for slot k.
	// +required
	Resource string `json:"resource"`
	// owner is the owner identity.
	// +required
	Owner string `json:"owner"`
	// requestID is the request ID, if any.
	// +optional
	RequestID string `json:"requestID,omitempty"`
	// leaseID is the LockGrant's UID.
	// +required
	LeaseID string `json:"leaseID"`
	// operationRoot is the operation root, if any.
	// +optional
	OperationRoot string `json:"operationRoot,omitempty"`
	// operationClass is the operation class, if any.
	// +optional
	OperationClass string `json:"operationClass,omitempty"`
	// fenceToken is the fencing token.
	// +required
	FenceToken int64 `json:"fenceToken"`
	// backendRevision is the FenceCounter's resourceVersion right after the
	// fence was issued (opaque).
	// +required
	BackendRevision string `json:"backendRevision"`
	// policy is the GuardPolicy the grant was issued under, if any.
	// +optional
	Policy string `json:"policy,omitempty"`
	// policyGeneration is that policy's generation at issue; 0 without one.
	// +optional
	PolicyGeneration int64 `json:"policyGeneration,omitempty"`
	// issuerEpoch is the issuer epoch at issue.
	// +optional
	IssuerEpoch int64 `json:"issuerEpoch,omitempty"`
	// ttlSeconds is the lease duration, in seconds.
	// +required
	TTLSeconds int64 `json:"ttlSeconds"`
	// keyID names the signing key.
	// +required
	KeyID string `json:"keyID"`
}

// LockGrant is one acquisition of a lease on a resource. Its UID is the
// owner token of this acquisition: renewals and release act on this object
// only, never on a later grant of the same owner. When Held it carries a
// fencing token that every protected write must present (Chubby's sequencers;
// Kleppmann, "How to do distributed locking", 2016).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lg;lgrant,categories=lockwarden
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resource`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Permit",type=integer,JSONPath=`.status.permit`,priority=1
// +kubebuilder:printcolumn:name="Fence",type=integer,JSONPath=`.status.fenceToken`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`
// +kubebuilder:printcolumn:name="Expires",type=string,format=date-time,JSONPath=`.status.expiresAt`
// +kubebuilder:printcolumn:name="Queue",type=integer,JSONPath=`.status.queuePosition`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:selectablefield:JSONPath=`.spec.resource`
type LockGrant struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the acquisition request.
	// +required
	Spec LockGrantSpec `json:"spec"`

	// status is the controller's answer.
	// +optional
	Status LockGrantStatus `json:"status,omitempty"`
}

// LockGrantList is a list of LockGrants.
//
// +kubebuilder:object:root=true
type LockGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LockGrant `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &LockGrant{}, &LockGrantList{})
}
