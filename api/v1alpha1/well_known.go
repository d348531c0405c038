package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// Labels and annotations that lockwarden reads or writes. The prefix is the
// API group.
const (
	// GuardedLabel marks an object as guarded: with the value "true", every
	// create, update and delete of the object goes through the guarded-write
	// admission webhook (selected by an objectSelector on this label). Removing
	// the label is itself a guarded write.
	GuardedLabel = "locking.lockwarden.io/guarded"

	// ResourceAnnotation names the fenced resource ID a guarded object
	// belongs to: a resource ID in the syntax of LockGrantSpec.Resource, or
	// one slot of a resource with permits, "ID#k" (see SlotResource); only
	// grants of that slot may write the object. It is immutable while the
	// object is guarded.
	ResourceAnnotation = "locking.lockwarden.io/resource"

	// GrantAnnotation, FenceAnnotation, ProofAnnotation and IntentAnnotation
	// are a write's claim: the grant the write is made under ("NAME" in the
	// object's own namespace, or "NAMESPACE/NAME"), its fencing token in
	// decimal, the grant proof (status.proof; required on objects a
	// GuardPolicy covers, checked when present elsewhere) and the intent
	// ("delete" to prepare a delete, else empty). A claim authorizes only the
	// write that sets it: admission removes it from the object in the same
	// write it accepts, and records what it accepted in the Accepted*
	// annotations. A write that carries no claim of its own (a merge patch
	// of the data alone, a re-read and update that does not set them again)
	// is refused.
	GrantAnnotation  = "locking.lockwarden.io/grant"
	FenceAnnotation  = "locking.lockwarden.io/fence"
	ProofAnnotation  = "locking.lockwarden.io/proof"
	IntentAnnotation = "locking.lockwarden.io/intent"
	// WriteIDAnnotation is part of the claim too: an optional random ID,
	// fresh for every write, which makes the claim one nobody can put on
	// an object before the write that makes it (pkg/lock sets one).
	WriteIDAnnotation = "locking.lockwarden.io/write-id"

	// AcceptedGrantAnnotation, AcceptedFenceAnnotation and
	// AcceptedIntentAnnotation are the record of the last write admission
	// accepted on a guarded object ("NAMESPACE/NAME", fence, intent). Only
	// admission writes them; a value on an object that was not guarded when
	// it was written is ignored.
	AcceptedGrantAnnotation  = "locking.lockwarden.io/accepted-grant"
	AcceptedFenceAnnotation  = "locking.lockwarden.io/accepted-fence"
	AcceptedIntentAnnotation = "locking.lockwarden.io/accepted-intent"
	// AcceptedProofAnnotation and AcceptedWriteIDAnnotation complete the
	// record: the proof the accepted write carried (on objects under a
	// GuardPolicy the record counts only when it verifies), and the write's
	// ID (its claim's write-id, when it had one).
	AcceptedProofAnnotation   = "locking.lockwarden.io/accepted-proof"
	AcceptedWriteIDAnnotation = "locking.lockwarden.io/accepted-write-id"

	// OverrideAnnotation is an administrator's override of a guarded
	// object wedged in the last issuer epoch (its recorded fence is of
	// epoch 8388607, above every fence the registry has issued): an update
	// that sets it to a reason is accepted whatever else it changes (it may
	// remove the guard label), and a delete by an administrator may follow
	// with that update's resourceVersion as precondition. The caller needs
	// the verb "override" on guardedobjects.locking.lockwarden.io in the
	// object's namespace. Admission consumes it like a claim; the record
	// keeps its fence, with accepted-intent "override". Any other object
	// refuses it (OVERRIDE_REFUSED): see docs/runbook.md.
	OverrideAnnotation = "locking.lockwarden.io/override"

	// ShadowDenialAnnotation is set on an object by a GuardPolicy in Shadow
	// mode when Enforce would have denied the write: "REASON: detail". It
	// is removed by the next write Enforce would admit.
	ShadowDenialAnnotation = "locking.lockwarden.io/shadow-denial"

	// FenceRegressionAnnotation is set on a LockGrant by its holder when a
	// protected resource refused the grant's writes with FENCE_REGRESSION
	// (the registry issued a fence the resource had already seen: a restore
	// from an old snapshot). The value is the resource's message. The
	// controller raises the grant's FenceRegression condition and a Warning
	// Event (reason FenceRegression) and counts the metric
	// lockwarden_grant_transitions_total{reason="FENCE_REGRESSION"}.
	FenceRegressionAnnotation = "locking.lockwarden.io/fence-regression"

	// OwnerGroupsAnnotation is stamped on every LockGrant at creation by
	// admission with the requester's groups (comma-separated), so that a
	// GuardPolicy that lists groups can be re-checked later. Immutable.
	OwnerGroupsAnnotation = "locking.lockwarden.io/owner-groups"

	// RequestedAtAnnotation is stamped on every LockGrant at creation by the
	// admission webhook (RFC 3339 with nanoseconds, the webhook's clock) and is
	// immutable. It orders waiters FIFO and starts the wait limit. A value sent
	// by a client is overwritten.
	RequestedAtAnnotation = "locking.lockwarden.io/requested-at"

	// DriverAnnotation binds a LockGrant to the one process that drives it
	// (its driver token): a random token the holder library (pkg/lock) sets at creation and
	// tests in every renew and release it sends. A second process that finds
	// the grant by its request ID cannot drive it (DRIVER_MISMATCH). Grants
	// created without it (kubectl lockwarden acquire, kubectl create) are renewed
	// by hand with kubectl lockwarden renew.
	DriverAnnotation = "locking.lockwarden.io/driver"

	// GeneratedRequestIDAnnotation ("true") marks a LockGrant whose request
	// ID its client generated at random (pkg/lock without WithRequestID,
	// kubectl lockwarden without --request-id): nobody else can know it,
	// so the controller does not record it in the namespace's
	// RequestIDLedger when it deletes the grant, and admission does not
	// look it up.
	GeneratedRequestIDAnnotation = "locking.lockwarden.io/generated-request-id"

	// ReusedRequestIDAnnotation is stamped by admission on a LockGrant
	// created with a request ID that an earlier grant spent, after that
	// ID's window (RequestIDLedger) passed: "<phase> <endedAt>", how and
	// when (RFC 3339) the earlier grant ended. Whoever saw the grant's name
	// before saw that earlier acquisition, so kubectl lockwarden refuses to
	// renew or release this one by name alone (UNKNOWN_GRANT; name its
	// UID). A value sent by a client is removed; it is immutable.
	ReusedRequestIDAnnotation = "locking.lockwarden.io/reused-request-id"

	// RequestIDLabel carries LockGrantSpec.RequestID so that a client whose
	// create response was lost can find its grant with a label selector:
	//   kubectl get lockgrants -l locking.lockwarden.io/request-id=ID
	// It is set by admission from the spec and cannot be changed.
	RequestIDLabel = "locking.lockwarden.io/request-id"

	// SessionLabel marks a coordination.k8s.io/v1 Lease as a client
	// session that LockGrants may name in spec.session (value "true"). The
	// controller watches only Leases with this label; admission refuses a
	// session Lease without it.
	SessionLabel = "locking.lockwarden.io/session"
)

// The syntax of the spec fields the CRD schemas bound by a pattern: the
// schema enforces the same expressions (TestMarkersMatchConstants keeps
// the markers and these in agreement), admission checks them first to
// answer INVALID_SPEC with the field, and clients (pkg/lock, kubectl
// lockwarden) check them before they send a request.
const (
	// ResourcePattern is the syntax of a resource ID
	// (LockGrantSpec.Resource): one or more segments separated by "/", each
	// of lowercase letters, digits, ".", "_" and "-", starting and ending
	// with a letter or digit; at most MaxResourceLength bytes.
	ResourcePattern = `^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$`
	// RequestIDPattern is the syntax of LockGrantSpec.RequestID: letters,
	// digits, ".", "_" and "-", starting and ending with a letter or
	// digit; at most MaxRequestIDLength bytes.
	RequestIDPattern = `^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`
	// OperationRootPattern is the syntax of LockGrantSpec.OperationRoot:
	// "sha256:" and 64 lowercase hex digits.
	OperationRootPattern = `^sha256:[0-9a-f]{64}$`
	// OperationClassPattern is the syntax of LockGrantSpec.OperationClass:
	// lowercase letters, digits and "-", starting and ending with a letter
	// or digit; at most MaxOperationClassLength bytes.
	OperationClassPattern = `^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	// SigningKeyIDPattern is the syntax of SigningKey.KeyID, with
	// OperationClassPattern's alphabet; at most MaxSigningKeyIDLength bytes.
	SigningKeyIDPattern = `^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	// GuardedResourcePattern is the syntax of GuardedResource.Resource, a
	// plural resource name such as "configmaps".
	GuardedResourcePattern = `^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
)

// Bounds of the fields above, in bytes. The CRD schemas enforce them too.
const (
	// MaxRequestIDLength is the longest LockGrantSpec.RequestID.
	MaxRequestIDLength = 63
	// MaxOperationClassLength is the longest LockGrantSpec.OperationClass.
	MaxOperationClassLength = 63
	// MaxSigningKeyIDLength is the longest SigningKey.KeyID.
	MaxSigningKeyIDLength = 32
)

var (
	resourceRE       = regexp.MustCompile(ResourcePattern)
	requestIDRE      = regexp.MustCompile(RequestIDPattern)
	operationRootRE  = regexp.MustCompile(OperationRootPattern)
	operationClassRE = regexp.MustCompile(OperationClassPattern)
)

// ValidResourceID reports whether id is a well-formed resource ID of at most
// MaxResourceLength bytes.
func ValidResourceID(id string) bool {
	return id != "" && len(id) <= MaxResourceLength && resourceRE.MatchString(id)
}

// ValidRequestID reports whether id matches RequestIDPattern and is at
// most MaxRequestIDLength bytes.
func ValidRequestID(id string) bool {
	return len(id) <= MaxRequestIDLength && requestIDRE.MatchString(id)
}

// ValidOperationRoot reports whether root matches OperationRootPattern.
func ValidOperationRoot(root string) bool { return operationRootRE.MatchString(root) }

// ValidOperationClass reports whether class matches OperationClassPattern
// and is at most MaxOperationClassLength bytes.
func ValidOperationClass(class string) bool {
	return len(class) <= MaxOperationClassLength && operationClassRE.MatchString(class)
}

// FenceCounterName returns the name of the FenceCounter of a fenced
// resource ID (a resource ID, or a slot "ID#k" of one): a readable prefix of
// the ID followed by a hash of the whole ID, so that distinct IDs never
// share a counter.
func FenceCounterName(resource string) string {
	sum := sha256.Sum256([]byte(resource))
	prefix := strings.NewReplacer("/", "-", ".", "-", "_", "-", SlotSeparator, "-").Replace(resource)
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	prefix = strings.TrimRight(prefix, "-")
	if prefix == "" {
		prefix = "r"
	}
	return prefix + "-" + hex.EncodeToString(sum[:])[:16]
}

// GrantNameForRequest returns the name a LockGrant with the given request ID
// must have: a hash of the request ID, so that the API server's name
// uniqueness makes acquisition idempotent. A client that retries a create
// whose response was lost gets AlreadyExists and reads its grant by this
// name; it can never create a second grant for the same request.
func GrantNameForRequest(requestID string) string {
	sum := sha256.Sum256([]byte(requestID))
	return "req-" + hex.EncodeToString(sum[:])[:24]
}

// Path prefixes of the per-policy guarded-write webhooks: the GuardPolicy
// controller installs a webhook per policy at prefix+name, and the manager
// serves every path under the prefix.
const (
	GuardPolicyEnforcePathPrefix = "/guardpolicy/enforce/"
	GuardPolicyShadowPathPrefix  = "/guardpolicy/shadow/"
)

// Reasons of Events lockwarden records on objects that are not its own
// kinds.
const (
	// EventReasonGuardOverridden: an administrator overrode the guard of a
	// wedged object (annotation locking.lockwarden.io/override); recorded on
	// the object and on the FenceIssuer.
	EventReasonGuardOverridden = "GuardOverridden"
	// EventReasonCertificateSecretCreated: the manager created its missing
	// webhook certificate Secret; recorded on the Secret.
	EventReasonCertificateSecretCreated = "CertificateSecretCreated"
)
