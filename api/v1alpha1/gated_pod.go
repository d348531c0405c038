package v1alpha1

// Labels, annotations and the scheduling gate of lock-gated Pods
// (docs/gated-workloads.md): a Pod that names a lock in LockAnnotation is
// held back by a scheduling gate until the manager has a Held grant for it,
// and carries that grant's fence when it starts.
const (
	// LockAnnotation on a Pod (or a Pod template) names the resource ID the
	// Pod runs under, in the Pod's namespace: admission gates the Pod, the
	// manager requests a grant of that resource on the Pod's behalf, owned
	// by the Pod's ServiceAccount, and lets the Pod start once the grant is
	// Held. It is read at creation only.
	LockAnnotation = "locking.lockwarden.io/lock"
	// TTLAnnotation on a gated Pod is the lease duration of its grant, as a
	// Go duration in whole seconds from 1s to 1h ("30s", "2m"). Default
	// DefaultPodLeaseSeconds.
	TTLAnnotation = "locking.lockwarden.io/ttl"
	// PermitsAnnotation on a gated Pod is the number of holders its resource
	// admits at once, from 1 to 64 (LockGrantSpec.Permits). Default 1.
	PermitsAnnotation = "locking.lockwarden.io/permits"
	// LockDelayAnnotation on a gated Pod is its grant's lock-delay, as a Go
	// duration in whole seconds from 0s to 1h (LockGrantSpec.LockDelaySeconds).
	// Default none.
	LockDelayAnnotation = "locking.lockwarden.io/lock-delay"

	// RequestedAtAnnotation is stamped on a gated Pod too, by the same
	// admission that gates it: the grant requested for the Pod carries the
	// Pod's stamp, so Pods are served in the order they were created.

	// GatedLabel (value "true") is set by admission on every Pod it gates;
	// the manager watches only Pods with this label.
	GatedLabel = "locking.lockwarden.io/gated"
	// PodSchedulingGate is the scheduling gate admission adds to a gated
	// Pod and the manager removes, once, when the Pod's grant is Held.
	PodSchedulingGate = "locking.lockwarden.io/lock"

	// GrantUIDAnnotation and FencedResourceAnnotation are written on a
	// gated Pod by the manager, with GrantAnnotation (the grant's name),
	// FenceAnnotation and ProofAnnotation, in the same write that removes
	// its scheduling gate: the grant's UID and the fenced resource ID of
	// the slot it holds (the resource ID itself for an exclusive lock).
	// Containers read them through the downward API.
	GrantUIDAnnotation       = "locking.lockwarden.io/grant-uid"
	FencedResourceAnnotation = "locking.lockwarden.io/fenced-resource"

	// StewardAnnotation is stamped by admission on a LockGrant that the
	// manager requests on a Pod's behalf: the manager's identity, which may
	// renew and release the grant for its owner, the Pod's ServiceAccount.
	// Immutable; admission removes it from every other grant.
	StewardAnnotation = "locking.lockwarden.io/steward"

	// PodRequestIDPrefix starts the request ID of a Pod's grant, followed
	// by the Pod's UID: one grant per Pod, named after it
	// (GrantNameForRequest).
	PodRequestIDPrefix = "pod-"

	// DefaultPodLeaseSeconds is the lease duration of a gated Pod's grant
	// when TTLAnnotation is not set, in seconds.
	DefaultPodLeaseSeconds = 30
)

// PodRequestID returns the request ID of the grant of the Pod with the given
// UID.
func PodRequestID(podUID string) string { return PodRequestIDPrefix + podUID }

// Reasons of the Events the manager records on a lock-gated Pod, and of the
// DisruptionTarget condition it sets on a Pod it deletes.
const (
	// GatedPodReasonWaiting: the Pod's grant was requested and waits in the
	// queue.
	GatedPodReasonWaiting = "Waiting"
	// GatedPodReasonGranted: the grant is Held; the Pod may start.
	GatedPodReasonGranted = "Granted"
	// GatedPodReasonLockLost: the grant ended while the Pod ran (it expired
	// after its node was lost or the manager could not renew it, was
	// revoked or force-released): the Pod is deleted.
	GatedPodReasonLockLost = "LockLost"
	// GatedPodReasonRequestEnded: the grant ended before it was Held
	// (withdrawn by its owner, revoked, deleted): the Pod, still gated, is
	// deleted.
	GatedPodReasonRequestEnded = "LockRequestEnded"
	// GatedPodReasonGateRemoved: the scheduling gate was removed by someone
	// else before the grant was Held: the Pod may run without its lock, and
	// is deleted.
	GatedPodReasonGateRemoved = "GateRemovedWithoutLock"
	// GatedPodReasonInvalidRequest: the Pod's lock annotations do not parse
	// (they changed after admission); no grant is requested.
	GatedPodReasonInvalidRequest = "InvalidLockRequest"
	// GatedPodReasonRequestRefused: admission refused the grant's request
	// (the ServiceAccount may no longer acquire); retried with backoff.
	GatedPodReasonRequestRefused = "LockRequestRefused"
	// GatedPodReasonNodeLost: the node's heartbeat lapsed; the grant is no
	// longer renewed and ends at its lease's end.
	GatedPodReasonNodeLost = "NodeHeartbeatLost"
	// GatedPodReasonNotReady: a started container of the Pod is not ready
	// (its readiness probe fails: it is stuck, frozen or overloaded); the
	// grant is not renewed while it stays so, and ends at its lease's end.
	GatedPodReasonNotReady = "ContainerNotReady"
)
