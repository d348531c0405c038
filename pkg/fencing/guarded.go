package fencing

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The guarded-object protocol (docs/guarded-writes.md).
//
// A write to a guarded object is authorized only by what the request itself
// asserts: a Claim (grant, fence, optional proof and intent) that the write
// sets and that the stored object did not already carry. The enforcement
// point consumes the claim (it is removed from the object by the same write
// that it authorizes) and writes a record (Accepted) of what it accepted. So a claim
// never outlives its write: a later write that only inherits the object's
// state asserts nothing and is refused, whoever sends it, even a stale
// replica that shares the holder's identity.
//
// A delete carries no object, so it is authorized in two steps: a write that
// claims intent "delete" (accepted like any write, and recorded with that
// intent), then a delete whose resourceVersion precondition is the version
// that write made. Nothing can slip in between, and a delete without that
// precondition is refused.

// Operation is the kind of request to a guarded object.
type Operation string

const (
	// OpCreate creates the object.
	OpCreate Operation = "CREATE"
	// OpUpdate changes it: update, any patch, server-side apply, or a write
	// to a subresource whose body is the object itself (status).
	OpUpdate Operation = "UPDATE"
	// OpDelete deletes it (also one item of a deletecollection).
	OpDelete Operation = "DELETE"
)

// IntentDelete is the intent a write claims to prepare a delete.
const IntentDelete = "delete"

// Claim is the raw text of what a request (or a stored object) carries in the
// claim annotations: grant ("NAME" or "NAMESPACE/NAME"), fence (decimal),
// proof (compact signed record), intent ("" or "delete") and write ID (any
// text, optional). The grant, fence and proof can be read from the grant by
// anyone allowed to read it; the write ID is what makes a claim
// unpredictable: a writer that sets a fresh random one on every write (as
// pkg/lock does) cannot have its claim squatted by a look-alike that
// carries the same grant and fence before the write.
type Claim struct {
	Grant, Fence, Proof, Intent, WriteID string
}

// IsZero reports whether nothing is claimed at all.
func (c Claim) IsZero() bool { return c == Claim{} }

// Assertion is a parsed, well-formed Claim.
type Assertion struct {
	// GrantNamespace and GrantName name the LockGrant.
	GrantNamespace, GrantName string
	// Fence is the fencing token claimed.
	Fence int64
	// Proof is the signed grant record, or empty.
	Proof Proof
	// Intent is "" for an ordinary write or IntentDelete.
	Intent string
}

// ParseClaim parses a claim made on an object of namespace objNamespace ("" for
// a cluster-scoped object). A namespaced object takes grants of its own
// namespace only, because resource IDs and fences are scoped to a namespace;
// a cluster-scoped object names the grant's namespace. It returns
// ReasonNoFence for a missing or malformed grant, fence or intent, and
// ReasonBindingMismatch for a grant of another namespace.
func ParseClaim(c Claim, objNamespace string) (Assertion, error) {
	fence, err := ParseFence(c.Fence)
	if err != nil {
		return Assertion{}, err
	}
	ns, name, found := strings.Cut(c.Grant, "/")
	if !found {
		ns, name = objNamespace, c.Grant
	}
	if !validName(name) || !validName(ns) {
		return Assertion{}, refuse(ReasonNoFence, "the write must name its grant as NAME or NAMESPACE/NAME (DNS names), got %q", c.Grant)
	}
	if objNamespace != "" && ns != objNamespace {
		return Assertion{}, refuse(ReasonBindingMismatch, "the grant %s/%s is in another namespace; resource IDs are scoped to a namespace, so an object in %q takes grants of %q only", ns, name, objNamespace, objNamespace)
	}
	if c.Intent != "" && c.Intent != IntentDelete {
		return Assertion{}, refuse(ReasonNoFence, "intent %q is not %q or empty", c.Intent, IntentDelete)
	}
	return Assertion{GrantNamespace: ns, GrantName: name, Fence: fence, Proof: Proof(c.Proof), Intent: c.Intent}, nil
}

// Accepted is what the enforcement point recorded on an object at the last
// write it accepted: the grant, its fence, the write's intent, the proof it
// carried and its write ID. Only the enforcement point writes it, in the
// same write it accepts.
type Accepted struct {
	// Grant is "NAMESPACE/NAME" of the grant.
	Grant string
	// Fence is the accepted fence; 0 when none.
	Fence int64
	// Intent is the accepted write's intent.
	Intent string
	// Proof is the proof the accepted write carried, or empty. Where the
	// record must be verified (objects under a GuardPolicy), a record counts
	// only with a proof that verifies and names its resource, grant and
	// fence.
	Proof Proof
	// WriteID is the accepted claim's write ID, or empty.
	WriteID string
}

// AcceptedOf parses a stored record's text. A record that does not parse is no
// record (fence 0): the enforcement point never writes one.
func AcceptedOf(grant, fence, intent, proof, writeID string) Accepted {
	f, err := ParseFence(fence)
	if err != nil || grant == "" {
		return Accepted{}
	}
	return Accepted{Grant: grant, Fence: f, Intent: intent, Proof: Proof(proof), WriteID: writeID}
}

// GuardedRequest is everything CheckGuardedRequest needs to decide on one
// admission request to a guarded object, gathered by the enforcement point.
type GuardedRequest struct {
	// Operation is the request's operation.
	Operation Operation
	// Subresource is the request's subresource, "" for the object itself.
	Subresource string
	// Opaque is true when the request's body is not the guarded object
	// (a Scale, an Eviction, a Binding): such a request cannot carry a
	// claim, so it is refused on a guarded object.
	Opaque bool
	// Resource is the resource ID the object is guarded by.
	Resource string
	// ObjectNamespace is the object's namespace, "" when cluster-scoped.
	ObjectNamespace string
	// Caller is the authenticated identity of the request.
	Caller string
	// Claim is what the object carries in the claim annotations after the
	// request is applied (create, update); zero for a delete.
	Claim Claim
	// StoredClaim is what the stored object carried in them before the
	// request; zero for a create. A claim equal to it is inherited, not
	// asserted by the request.
	StoredClaim Claim
	// StoredGuarded is true when the stored object was guarded: only then is
	// Record the enforcement point's own.
	StoredGuarded bool
	// Record is the stored object's record (AcceptedOf); ignored unless
	// StoredGuarded.
	Record Accepted
	// VerifyRecord is true where a record counts only with a proof that
	// verifies (objects under a GuardPolicy, whose Shadow mode or a
	// widened selector may have let anyone write one).
	VerifyRecord bool
	// Unguards is true when the request leaves the object unguarded.
	Unguards bool
	// StoredVersion is the stored object's resourceVersion; Precondition is
	// the resourceVersion precondition of a delete, "" when none.
	StoredVersion, Precondition string
	// NamespaceTerminating is true when the object's namespace is being
	// deleted: its objects go with it.
	NamespaceTerminating bool
	// RequireProof is true when the object is under a policy: the claim must
	// carry a proof issued under Policy at PolicyGeneration or older.
	RequireProof     bool
	Policy           string
	PolicyGeneration int64
	// Override is the administrator's override the request asserts (an
	// update that sets the override annotation), or, for a delete of an
	// object whose record has intent IntentOverride, the caller's
	// authorization to make one; nil otherwise.
	Override *Override
	// Bundle is the trust bundle proofs are verified with. Its current and
	// revoked epochs also judge every fence, proof or not: a fence of a
	// revoked or superseded issuer epoch is refused at once, before the
	// controller has revoked its grant. nil skips that check.
	Bundle *TrustBundle
	// Grant and Counter are the registry's facts for the claimed grant (for
	// a delete: the recorded grant) and the resource, read linearizably.
	Grant   *Grant
	Counter *Counter
	// Now is the enforcement point's clock.
	Now time.Time
}

// Target returns the grant a request must be judged against: the one it
// claims (create, update) or the one recorded by its pre-delete write
// (delete), as NAMESPACE and NAME; ok is false when there is none to read.
func (r GuardedRequest) Target() (namespace, name string, ok bool) {
	if r.Operation == OpDelete {
		if !r.StoredGuarded || r.Record.Grant == "" || r.ObjectNamespace == "" {
			return "", "", false
		}
		ns, n, found := strings.Cut(r.Record.Grant, "/")
		return ns, n, found && ns == r.ObjectNamespace
	}
	a, err := ParseClaim(r.Claim, r.ObjectNamespace)
	if err != nil {
		return "", "", false
	}
	return a.GrantNamespace, a.GrantName, true
}

// recorded is the fence the stored object accepted last, as far as the
// enforcement point can trust it: 0 unless the stored object was guarded,
// the record names a grant of the object's own namespace (fences of another
// namespace are another resource's) and, where it must be verified, its
// proof verifies for exactly this namespace, resource, grant, fence and
// policy.
func (r GuardedRequest) recorded() int64 {
	if !r.StoredGuarded || r.Record.Fence == 0 {
		return 0
	}
	if ns, _, _ := strings.Cut(r.Record.Grant, "/"); ns != r.ObjectNamespace {
		return 0
	}
	if !r.VerifyRecord {
		return r.Record.Fence
	}
	if r.Bundle == nil || r.Record.Proof == "" {
		return 0
	}
	rec, err := r.Bundle.VerifyProof(r.Record.Proof)
	if err != nil || rec.Namespace != r.ObjectNamespace || rec.Resource != r.Resource || rec.Fence != r.Record.Fence ||
		rec.Namespace+"/"+rec.Grant != r.Record.Grant || (r.Policy != "" && rec.Policy != r.Policy) {
		return 0
	}
	return r.Record.Fence
}

// validName reports whether s is a DNS subdomain name (RFC 1123), as grant
// names and namespaces are.
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

// CheckGuardedRequest decides on one request to a guarded object. On
// acceptance of a create or update it returns the Accepted record the enforcement
// point must write in the same write, with the claim removed; a delete
// returns the zero Accepted. It refuses, in this order:
//
//  1. ReasonNoFence: a request whose body cannot carry a claim (Opaque:
//     scale, eviction, binding).
//  2. Delete: ReasonNoFence unless the delete carries a resourceVersion
//     precondition equal to the stored version and the stored object's
//     record (written by this enforcement point) has intent "delete"; then
//     the recorded grant and fence are judged by CheckWrite as of now. A
//     record of intent IntentOverride instead admits the delete of an
//     administrator (ReasonNotOwner for anyone else) while the object is
//     still wedged (ReasonOverrideRefused once it is not; see Override).
//  3. A create or update that asserts an Override: ReasonNotOwner unless the
//     caller is authorized, ReasonOverrideRefused unless the object is
//     Wedged and the override gives a reason; accepted as it is otherwise,
//     the record kept with intent IntentOverride.
//  4. Other creates and updates: ReasonNoFence when the request claims nothing, or only
//     what the stored object already carried (an inherited claim is not an
//     assertion); ParseClaim's refusals; ReasonNoFence when a proof is
//     required and missing; ReasonFenceNotIssued when the fence is not
//     one an issuer issued to the claimed grant (CheckIssued);
//     ReasonRevokedEpoch when, by the Bundle, the
//     fence's issuer epoch is revoked or superseded (deletes: the recorded
//     fence's); then CheckProvenWrite (with a proof) or
//     CheckWrite, against the stored record when the stored object was
//     guarded.
//
// A delete while the object's namespace terminates is accepted: the
// namespace's objects go with it. A cluster-scoped object cannot be guarded
// (ReasonNoResource; only a write that removes the guard is accepted): it
// would take grants of every namespace, each with fences of its own. The
// stored record counts only if the stored object was guarded and, where
// VerifyRecord is set, its proof verifies for this resource, grant and fence.
func CheckGuardedRequest(r GuardedRequest) (Accepted, error) {
	if r.Operation == OpDelete && r.NamespaceTerminating {
		return Accepted{}, nil
	}
	if r.Opaque {
		return Accepted{}, refuse(ReasonNoFence, "a %s request cannot carry a grant and fence; make the change with a fenced write to the object itself", describe(r.Subresource))
	}
	if r.ObjectNamespace == "" {
		// A resource ID names a resource of one namespace; a cluster-scoped
		// object would take grants of every namespace, each with fences of
		// its own.
		if r.Unguards && r.Operation != OpDelete {
			return Accepted{}, nil
		}
		return Accepted{}, refuse(ReasonNoResource, "cluster-scoped objects cannot be guarded: resource IDs and fences are scoped to a namespace; remove the label %s", "locking.lockwarden.io/guarded")
	}
	recorded := r.recorded()
	if r.Operation == OpDelete {
		return Accepted{}, checkDelete(r, recorded)
	}
	if r.Override != nil {
		return checkOverride(r, recorded)
	}
	claim := r.Claim
	switch {
	case claim.IsZero():
		return Accepted{}, refuse(ReasonNoFence, "the write asserts no grant and fence of its own; set them in this write (each accepted write consumes them)")
	case claim == r.StoredClaim:
		return Accepted{}, refuse(ReasonNoFence, "the write's grant and fence are the ones the object already carried; a write must assert them itself")
	}
	a, err := ParseClaim(claim, r.ObjectNamespace)
	if err != nil {
		return Accepted{}, err
	}
	if r.RequireProof && a.Proof == "" {
		return Accepted{}, refuse(ReasonNoFence, "objects under GuardPolicy %q need the grant's proof with every write", r.Policy)
	}
	// A fence that was never issued (rounded by a JSON tool, say) is
	// refused as such before its epoch is judged: its epoch bits may say
	// anything.
	if err := CheckIssued(a.Fence, r.Grant); err != nil {
		return Accepted{}, err
	}
	if err := checkEpoch(r.Bundle, a.Fence); err != nil {
		return Accepted{}, err
	}
	w := Write{Resource: r.Resource, Caller: r.Caller, Fence: a.Fence, Recorded: recorded, Grant: r.Grant, Counter: r.Counter, Now: r.Now}
	if a.Proof == "" {
		err = CheckWrite(w)
	} else {
		pw := ProvenWrite{Proof: a.Proof, Bundle: r.Bundle, GrantNamespace: a.GrantNamespace, GrantName: a.GrantName, Write: w}
		if r.RequireProof {
			pw.Policy, pw.PolicyGeneration = r.Policy, r.PolicyGeneration
		}
		err = CheckProvenWrite(pw)
	}
	if err != nil {
		return Accepted{}, err
	}
	return Accepted{Grant: a.GrantNamespace + "/" + a.GrantName, Fence: a.Fence, Intent: a.Intent, Proof: a.Proof, WriteID: claim.WriteID}, nil
}

func checkDelete(r GuardedRequest, recorded int64) error {
	switch {
	case r.Precondition == "" || r.Precondition != r.StoredVersion:
		return refuse(ReasonNoFence, "a delete of a guarded object must carry the resourceVersion precondition of the version your pre-delete write made (the object is at %q, the delete names %q)", r.StoredVersion, r.Precondition)
	case recorded == 0:
		return refuse(ReasonNoFence, "the object has no accepted write to delete under; write your grant with intent %q first", IntentDelete)
	case r.Record.Intent == IntentOverride:
		return checkOverrider(r, recorded)
	case r.Record.Intent != IntentDelete:
		return refuse(ReasonNoFence, "the last accepted write did not claim intent %q; write your grant with that intent, then delete with its resourceVersion as precondition", IntentDelete)
	}
	if err := checkEpoch(r.Bundle, recorded); err != nil {
		return err
	}
	return CheckWrite(Write{Resource: r.Resource, Caller: r.Caller, Fence: recorded, Recorded: recorded, Grant: r.Grant, Counter: r.Counter, Now: r.Now})
}

// checkEpoch is CheckFenceEpoch by the bundle's epochs; nil without a
// bundle.
func checkEpoch(b *TrustBundle, fence int64) error {
	if b == nil {
		return nil
	}
	return CheckFenceEpoch(fence, b.CurrentEpoch, b.RevokedEpochs)
}

// CheckFenceEpoch refuses (ReasonRevokedEpoch) a fence issued in an issuer
// epoch that is revoked or older than the current one: every grant of such
// an epoch is revoked, whether or not the controller has said so yet.
func CheckFenceEpoch(fence, current int64, revoked []int64) error {
	switch e := EpochOf(fence); {
	case slices.Contains(revoked, e):
		return refuse(ReasonRevokedEpoch, "fence %s was issued in revoked issuer epoch %d", FormatFence(fence), e)
	case e < current:
		return refuse(ReasonRevokedEpoch, "fence %s was issued in issuer epoch %d; the issuer moved to epoch %d", FormatFence(fence), e, current)
	}
	return nil
}

func describe(sub string) string {
	if sub == "" {
		return "request"
	}
	return fmt.Sprintf("%q subresource", sub)
}

// AcceptFromCache decides on a guarded request whose registry facts (Grant
// and Counter) were read from a cache that may be behind the registry, such
// as an enforcement point's informer of FenceCounters. It answers only an
// acceptance: ok is true, with the record, when CheckGuardedRequest accepts r
// and the facts are ones a cache may accept on (CachedFactsSuffice). Any
// other outcome, a refusal included, is no answer: the enforcement point
// must gather the facts again with a linearizable read and decide with
// CheckGuardedRequest, which alone may refuse. So a successor's first write
// is never refused because the cache still names the holder before it.
//
// What a cache behind the registry can add is bounded: it accepts only a
// grant the counter named, with its fence, while the lease end it recorded
// has not passed by r.Now (renewals only lengthen a lease), so a release,
// revocation, forced release or lapsed session takes effect after the
// cache's lag instead of at the counter's swap, never after that lease
// end; and a fence below the one recorded on the object is refused as
// always (the record comes with the request, not from the cache). Only a
// write to an object that carries a record is accepted at all: the record
// is what orders the old holder's writes in the lag before its successor's,
// and a create has none (the successor may have deleted the object).
func AcceptFromCache(r GuardedRequest) (rec Accepted, ok bool) {
	if !CachedFactsSuffice(r) {
		return Accepted{}, false
	}
	rec, err := CheckGuardedRequest(r)
	if err != nil {
		return Accepted{}, false
	}
	return rec, true
}

// CachedFactsSuffice reports whether the registry facts of r, read from a
// cache, are good enough to accept r on: a create, update or delete under
// a grant (no administrator's override, which is judged on the registry's
// fence), the counter naming that grant as its holder, Held, with the
// grant's fence as the counter's newest, a lease end that has not passed by
// r.Now, the stored object carrying a record that counts (recorded: an
// update of a guarded object, never a create), and the fence the request is
// judged by (the claim's, or for a delete the recorded one) equal to the
// grant's. The record is what orders a write the cache accepts in its lag
// before the successor's first write to the object; a create has none (the
// successor may have deleted the object, and its record with it). It says
// nothing about refusing: a refusal is decided on facts read linearizably.
func CachedFactsSuffice(r GuardedRequest) bool {
	g, c := r.Grant, r.Counter
	if r.Override != nil || r.Opaque || g == nil || c == nil || g.UID == "" {
		return false
	}
	if g.State != StateHeld || c.HolderUID != g.UID || c.Fence != g.Fence || g.ExpiresAt.IsZero() || Expired(g.ExpiresAt, r.Now) {
		return false
	}
	if r.recorded() == 0 {
		// Nothing on the object orders this write after the writes of a
		// successor the cache does not show yet: a create (the successor
		// may have deleted the object, and its record with it), an object
		// that was not guarded, or a record that does not count. Only the
		// object's own record keeps the old holder's writes in the lag
		// before the successor's first write; without one, the direct read
		// decides.
		return false
	}
	var fence int64
	switch r.Operation {
	case OpCreate, OpUpdate:
		a, err := ParseClaim(r.Claim, r.ObjectNamespace)
		if err != nil {
			return false
		}
		fence = a.Fence
	case OpDelete:
		fence = r.recorded()
	default:
		return false
	}
	return fence == g.Fence
}
