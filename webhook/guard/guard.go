// Package guard holds the guarded-write admission webhooks: the enforcement
// point of the fencing rules for Kubernetes objects. An object is guarded
// when it carries the label locking.lockwarden.io/guarded=true, or when a
// GuardPolicy covers it.
//
// A write to a guarded object is authorized only by the claim it sets itself
// (grant, fence, and the proof under a policy); see fencing.CheckGuardedRequest
// and docs/guarded-writes.md. The webhooks gather the facts (the request's
// claim, the stored object's claim and record, the grant and the resource's
// FenceCounter read directly from the API server, the trust bundle, the
// policy) and call pkg/fencing; with a Cache they first try to accept on
// the informer's counter, and read directly before anything else (Checker):
//
//   - a mutating webhook checks every create and update, and on acceptance
//     removes the claim from the object and records what it accepted in the
//     locking.lockwarden.io/accepted-* annotations, in the same write, so the
//     check and the record are one atomic write and a claim never outlives
//     the write that made it;
//   - a validating webhook checks deletes (a pre-delete write with intent
//     "delete", then a delete with that version as precondition);
//   - a validating webhook without objectSelector refuses the subresource
//     requests whose body cannot carry a claim (scale, eviction, binding) on
//     guarded objects, looking the object itself up. The API server cannot
//     select these requests by the object's labels, so this webhook fails
//     open: while no replica answers they pass, except a binding that would
//     write lockwarden's labels or annotations, and requests to objects
//     under an Enforce GuardPolicy without a selector, whose own webhook
//     refuses them (PolicyHandler).
//
// They have no side effects on stored state: if a write fails after
// admission (a resourceVersion conflict), nothing was recorded, and the
// retry is checked again against the fresh object. They emit Events where
// an operator must act (a FENCE_REGRESSION, on the FenceIssuer; an
// administrator's override of a wedged object), never for a dry run.
package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// Checker gathers the facts of a guarded write and decides on it.
//
// With a Cache (the manager's informers, --guard-reads=cached, the
// default) it gathers and decides twice. First on the resource's
// FenceCounter as the cache shows it, and only when that counter names the
// claimed grant with its lease (facts.HolderGrant): fencing.AcceptFromCache
// answers only an acceptance, on a counter that names the grant with its
// fence and a lease end not passed by Clock. Anything else (no counter in
// the cache, another holder, a lease over, another fence, any refusal, any
// error) gathers again with a direct read (facts.ReadRegistry) and decides
// with fencing.CheckGuardedRequest; only that second decision refuses,
// emits Events and is counted as a refusal. So a successor's first write is
// never refused because the cache still names the holder before it. What
// the cache adds is the answering replica's watch lag: a release,
// revocation, forced release or lapsed session takes effect in admission
// milliseconds after the counter's swap instead of at it, and never after
// the lease end the cache recorded; the object's own record, which comes
// with the request, still refuses a fence below the one it accepted
// (docs/grant-path.md). Without a Cache every decision reads directly.
type Checker struct {
	// Reader reads grants, counters and namespaces directly from the API
	// server (a linearizable read; never an informer cache).
	Reader client.Reader
	// Cache, when set, is the informer cache of FenceCounters read first
	// (see above); nil: every decision reads Reader.
	Cache client.Reader
	// Clock is the clock leases are judged by; the controller's.
	Clock clock.PassiveClock
	// Bundle returns the issuer's current trust bundle.
	Bundle func(context.Context) (*fencing.TrustBundle, error)
	// Authorizer answers the SubjectAccessReviews of an administrator's
	// override (fencing.Override); nil: nobody may override.
	Authorizer client.Client
	// Recorder emits the Events an operator must see about the issuer
	// (FENCE_REGRESSION) and about overrides; nil: none.
	Recorder events.EventRecorder
}

// object is the part of any Kubernetes object the webhooks read.
type object struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
}

// write is one admission request, decoded.
type write struct {
	req      admission.Request
	old, new *object
}

func decode(req admission.Request) (write, error) {
	w := write{req: req}
	parse := func(raw []byte) (*object, error) {
		if len(raw) == 0 {
			return nil, nil
		}
		o := &object{}
		if err := json.Unmarshal(raw, o); err != nil {
			return nil, fmt.Errorf("decoding object: %w", err)
		}
		return o, nil
	}
	var err error
	if w.old, err = parse(req.OldObject.Raw); err != nil {
		return w, err
	}
	w.new, err = parse(req.Object.Raw)
	return w, err
}

// claimOf is the claim an object carries; zero for nil.
func claimOf(o *object) fencing.Claim {
	if o == nil {
		return fencing.Claim{}
	}
	a := o.Annotations
	return fencing.Claim{
		Grant: a[lockingv1alpha1.GrantAnnotation], Fence: a[lockingv1alpha1.FenceAnnotation],
		Proof: a[lockingv1alpha1.ProofAnnotation], Intent: a[lockingv1alpha1.IntentAnnotation],
		WriteID: a[lockingv1alpha1.WriteIDAnnotation],
	}
}

// recordOf is the record an object carries; zero for nil.
func recordOf(o *object) fencing.Accepted {
	if o == nil {
		return fencing.Accepted{}
	}
	a := o.Annotations
	return fencing.AcceptedOf(a[lockingv1alpha1.AcceptedGrantAnnotation], a[lockingv1alpha1.AcceptedFenceAnnotation],
		a[lockingv1alpha1.AcceptedIntentAnnotation], a[lockingv1alpha1.AcceptedProofAnnotation], a[lockingv1alpha1.AcceptedWriteIDAnnotation])
}

// guarding is how the object of a request is guarded: by what resource, and
// whether the stored object was guarded (only then is its record the
// guard's own), and under which policy.
type guarding struct {
	resource               string
	storedGuarded, unguard bool
	policy                 *lockingv1alpha1.GuardPolicy
}

// request is the GuardedRequest of w with what the request itself says,
// before any read.
func (c *Checker) request(w write, g guarding) fencing.GuardedRequest {
	r := fencing.GuardedRequest{
		Operation: fencing.Operation(w.req.Operation), Subresource: w.req.SubResource,
		Resource: g.resource, ObjectNamespace: objectNamespace(w.req), Caller: w.req.UserInfo.Username,
		Claim: claimOf(w.new), StoredClaim: claimOf(w.old),
		StoredGuarded: g.storedGuarded, Record: recordOf(w.old),
		VerifyRecord: g.policy != nil, Unguards: g.unguard,
		Now: c.Clock.Now(),
	}
	if w.old != nil {
		r.StoredVersion = w.old.ResourceVersion
	}
	if w.req.Operation == admissionv1.Delete {
		r.Claim = fencing.Claim{}
		r.Precondition = preconditionOf(w.req)
	}
	if g.policy != nil {
		r.RequireProof, r.Policy, r.PolicyGeneration = true, g.policy.Name, g.policy.Generation
	}
	return r
}

// gather reads everything a decision on w needs into a GuardedRequest,
// the registry's facts directly from the API server.
func (c *Checker) gather(ctx context.Context, w write, g guarding) (fencing.GuardedRequest, error) {
	r := c.request(w, g)
	if w.req.Operation == admissionv1.Delete {
		r.NamespaceTerminating = c.namespaceTerminating(ctx, w.req.Namespace)
	}
	if ns, name, ok := r.Target(); ok {
		var err error
		if r.Grant, r.Counter, err = facts.ReadRegistry(ctx, c.Reader, ns, name, g.resource); err != nil {
			return r, err
		}
	}
	if err := c.gatherOverride(ctx, w, &r); err != nil {
		return r, err
	}
	return r, c.gatherBundle(ctx, &r)
}

// gatherBundle adds the trust bundle where r needs it.
func (c *Checker) gatherBundle(ctx context.Context, r *fencing.GuardedRequest) error {
	if _, _, ok := r.Target(); ok || r.Claim.Proof != "" || r.Record.Proof != "" {
		// The bundle verifies proofs, and its epochs judge every fence.
		bundle, err := c.Bundle(ctx)
		if err != nil {
			return fmt.Errorf("reading the trust bundle: %w", err)
		}
		r.Bundle = bundle
	}
	return nil
}

// cacheReadTimeout bounds a read of the Cache.
const cacheReadTimeout = 100 * time.Millisecond

// gatherCached gathers the facts of w with the registry's from the Cache:
// ok only when the cached counter names the grant w is judged on with its
// lease (facts.HolderGrant), and w asserts no administrator's override
// (judged on the registry's fence, read directly). A delete's namespace is
// not read: a terminating namespace only adds a reason to accept, which
// the direct read finds.
func (c *Checker) gatherCached(ctx context.Context, w write, g guarding) (fencing.GuardedRequest, bool) {
	if c.Cache == nil {
		return fencing.GuardedRequest{}, false
	}
	if _, asserted := overrideAsserted(w); asserted {
		return fencing.GuardedRequest{}, false
	}
	r := c.request(w, g)
	ns, name, ok := r.Target()
	if !ok || (r.Operation == fencing.OpDelete && r.Record.Intent == fencing.IntentOverride) {
		return r, false
	}
	counter := &lockingv1alpha1.FenceCounter{}
	key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(g.resource)}
	// A synced informer answers at once; one still syncing (a replica just
	// started) would hold the write until it is: read directly instead.
	cctx, cancel := context.WithTimeout(ctx, cacheReadTimeout)
	defer cancel()
	if err := c.Cache.Get(cctx, key, counter); err != nil || facts.HolderGrant(counter, name) == nil {
		return r, false
	}
	r.Grant, r.Counter = facts.Registry(name, nil, counter)
	if err := c.gatherBundle(ctx, &r); err != nil {
		return r, false
	}
	return r, true
}

// preconditionOf is the resourceVersion precondition of a delete, from the
// request's own options; "" when none.
func preconditionOf(req admission.Request) string {
	if len(req.Options.Raw) == 0 {
		return ""
	}
	var opts metav1.DeleteOptions
	if err := json.Unmarshal(req.Options.Raw, &opts); err != nil || opts.Preconditions == nil || opts.Preconditions.ResourceVersion == nil {
		return ""
	}
	return *opts.Preconditions.ResourceVersion
}

// decide gathers and decides; on an accepted create or update it returns the
// record to write. With a Cache it first tries to accept on the cached
// counter; only the decision on the direct read may refuse or announce.
func (c *Checker) decide(ctx context.Context, w write, g guarding) (fencing.Accepted, error) {
	if r, ok := c.gatherCached(ctx, w, g); ok {
		if rec, ok := fencing.AcceptFromCache(r); ok {
			countRead(w.req, "cache")
			return rec, nil
		}
	}
	r, err := c.gather(ctx, w, g)
	if err != nil {
		return fencing.Accepted{}, err
	}
	if _, _, ok := r.Target(); ok {
		countRead(w.req, "direct")
	}
	rec, err := fencing.CheckGuardedRequest(r)
	c.announce(ctx, w.req, r, err)
	return rec, err
}

// countRead counts a decision on a grant by where its counter was read;
// not for a dry run.
func countRead(req admission.Request, read string) {
	if !dryRun(req) {
		registryReads.WithLabelValues(read).Inc()
	}
}

// namespaceTerminating reports whether namespace name is being deleted; a
// failed read counts as not.
func (c *Checker) namespaceTerminating(ctx context.Context, name string) bool {
	terminating, err := facts.NamespaceTerminating(ctx, c.Reader, name)
	return err == nil && terminating
}

// consumedAnnotations are the claim's annotations an accepted write
// consumes, with a Shadow policy's denial note and an administrator's
// override, which an accepted write makes stale.
var consumedAnnotations = []string{
	lockingv1alpha1.GrantAnnotation, lockingv1alpha1.FenceAnnotation, lockingv1alpha1.ProofAnnotation,
	lockingv1alpha1.IntentAnnotation, lockingv1alpha1.WriteIDAnnotation, lockingv1alpha1.ShadowDenialAnnotation,
	lockingv1alpha1.OverrideAnnotation,
}

// consume is the accepted create or update o with its claim removed and
// rec recorded, as a JSON patch response of only those annotation
// operations (RFC 6902): the object is neither re-encoded nor diffed.
func consume(o *object, rec fencing.Accepted) admission.Response {
	set := map[string]string{
		lockingv1alpha1.AcceptedGrantAnnotation: rec.Grant,
		lockingv1alpha1.AcceptedFenceAnnotation: fencing.FormatFence(rec.Fence),
	}
	var drop []string
	optional := func(key, value string) {
		if value != "" {
			set[key] = value
		} else {
			drop = append(drop, key)
		}
	}
	optional(lockingv1alpha1.AcceptedIntentAnnotation, rec.Intent)
	optional(lockingv1alpha1.AcceptedProofAnnotation, string(rec.Proof))
	optional(lockingv1alpha1.AcceptedWriteIDAnnotation, rec.WriteID)
	return admission.Response{
		Patches: annotationPatch(o.Annotations, set, append(drop, consumedAnnotations...)),
		AdmissionResponse: admissionv1.AdmissionResponse{
			Allowed: true, PatchType: ptr.To(admissionv1.PatchTypeJSONPatch),
		},
	}
}

// annotationPatch is the JSON patch that turns annotations ann into ann
// with set's keys set and drop's keys removed: one operation per key that
// changes, in a stable order, or one add of the whole map where the object
// has none.
func annotationPatch(ann, set map[string]string, drop []string) []jsonpatch.JsonPatchOperation {
	if ann == nil {
		return []jsonpatch.JsonPatchOperation{{Operation: "add", Path: "/metadata/annotations", Value: set}}
	}
	var ops []jsonpatch.JsonPatchOperation
	for _, k := range slices.Sorted(maps.Keys(set)) {
		if v, ok := ann[k]; !ok || v != set[k] {
			ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "add", Path: annotationPath(k), Value: set[k]})
		}
	}
	slices.Sort(drop)
	for _, k := range slices.Compact(drop) {
		if _, ok := ann[k]; ok {
			ops = append(ops, jsonpatch.JsonPatchOperation{Operation: "remove", Path: annotationPath(k)})
		}
	}
	return ops
}

// pointerEscape escapes a JSON pointer's reference token (RFC 6901).
var pointerEscape = strings.NewReplacer("~", "~0", "/", "~1")

// annotationPath is the JSON pointer of annotation key.
func annotationPath(key string) string {
	return "/metadata/annotations/" + pointerEscape.Replace(key)
}

// labelGuarding is how an object guarded by label is guarded: by the
// resource it was guarded by, else the one it will be. Changing it while
// guarded is refused.
func labelGuarding(w write) (guarding, error) {
	oldGuarded, newGuarded := labeled(w.old), labeled(w.new)
	resource, err := fencing.CheckLabelBinding(oldGuarded, newGuarded, annotation(w.old, lockingv1alpha1.ResourceAnnotation),
		annotation(w.new, lockingv1alpha1.ResourceAnnotation), lockingv1alpha1.ResourceAnnotation, lockingv1alpha1.ValidFencedResource)
	if err != nil {
		return guarding{}, err
	}
	return guarding{resource: resource, storedGuarded: oldGuarded, unguard: !newGuarded}, nil
}

// annotation is annotation key of o; "" for nil.
func annotation(o *object, key string) string {
	if o == nil {
		return ""
	}
	return o.Annotations[key]
}

func labeled(o *object) bool {
	return o != nil && o.Labels[lockingv1alpha1.GuardedLabel] == "true"
}

// policyGuarding is how an object under a policy is guarded: by the resource
// ID of the stored object when there is one; a write that would change it is
// refused.
func policyGuarding(w write, pol *lockingv1alpha1.GuardPolicy, newCovered bool) (guarding, error) {
	resource, err := policy.CheckBinding(pol, policyObject(w.old), policyObject(w.new))
	if err != nil {
		return guarding{}, err
	}
	// The stored record counts only if its proof verifies (VerifyRecord):
	// whether the policy covered the object when it was written cannot be
	// known now (Shadow mode, a widened selector).
	return guarding{resource: resource, storedGuarded: w.old != nil, unguard: !newCovered, policy: pol}, nil
}

// policyObject is what the GuardPolicy rules read of o; nil for nil.
func policyObject(o *object) *policy.Object {
	if o == nil {
		return nil
	}
	return &policy.Object{Namespace: o.Namespace, Name: o.Name, Annotations: o.Annotations}
}

// objectNamespace is the namespace the object lives in, "" for a
// cluster-scoped object. A Namespace object's admission request names the
// namespace itself, but the object is cluster-scoped.
func objectNamespace(req admission.Request) string {
	if req.Resource.Group == "" && req.Resource.Resource == "namespaces" {
		return ""
	}
	return req.Namespace
}

// Reads is where the guarded-write webhooks read the resource's
// FenceCounter first: the manager's --guard-reads.
type Reads string

const (
	// ReadsCached accepts from the manager's informer cache when its
	// counter names the claimed grant with a live lease, and reads
	// directly before anything else (Checker). The default.
	ReadsCached Reads = "cached"
	// ReadsDirect reads the counter directly from the API server for every
	// decision.
	ReadsDirect Reads = "direct"
)

// ParseReads parses a --guard-reads value.
func ParseReads(s string) (Reads, error) {
	switch r := Reads(s); r {
	case ReadsCached, ReadsDirect:
		return r, nil
	}
	return "", fmt.Errorf("--guard-reads must be %q or %q, not %q", ReadsCached, ReadsDirect, s)
}

// CacheFor is the Checker's Cache under r: cache with ReadsCached, none
// with ReadsDirect, which never consults it.
func (r Reads) CacheFor(cache client.Reader) client.Reader {
	if r == ReadsDirect {
		return nil
	}
	return cache
}
