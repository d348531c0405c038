// Package guard holds the guarded-write admission webhooks: the enforcement
// point of the fencing rules for Kubernetes objects. An object is guarded
// when it carries the label locking.lockwarden.io/guarded=true, or when a
// GuardPolicy covers it; it can then be created, updated or deleted only by
// the owner of the resource's current grant, carrying that grant's fence
// (and, under a policy, its signed proof).
//
// The webhooks gather the facts (the object's recorded fence, the grant and
// the resource's FenceCounter, both read directly from the API server, the
// trust bundle, the policy) and call pkg/fencing. They have no side effects
// on stored state: an accepted write records its own fence in the object's
// locking.lockwarden.io/fence annotation, so the check and the record are
// one atomic write. If the write then fails on a resourceVersion conflict,
// nothing was recorded, and the retry is checked again against the fresh
// object.
package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/facts"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Checker gathers the facts of a guarded write and decides on it.
type Checker struct {
	// Reader reads grants, counters and namespaces directly from the API
	// server (a linearizable read; never an informer cache).
	Reader client.Reader
	// Clock is the clock leases are judged by; the controller's.
	Clock clock.PassiveClock
	// Bundle returns the issuer's current trust bundle.
	Bundle func(context.Context) (*fencing.TrustBundle, error)
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

// carrier is the object whose annotations carry the write's grant, fence and
// proof: the new object, or, for a delete, the stored one (write your grant
// onto the object, then delete it with a resourceVersion precondition).
func (w write) carrier() *object {
	if w.req.Operation == admissionv1.Delete {
		return w.old
	}
	return w.new
}

// check decides on a write to an object guarded by resource. With a policy,
// the write must carry a proof issued under it; without one, a proof is
// checked when present.
func (c *Checker) check(ctx context.Context, w write, resource string, pol *lockingv1alpha1.GuardPolicy) error {
	if w.req.Operation == admissionv1.Delete && c.namespaceTerminating(ctx, w.req.Namespace) {
		return nil // the namespace is going away with everything in it
	}
	carrier := w.carrier()
	fence, err := fencing.ParseFence(carrier.Annotations[lockingv1alpha1.FenceAnnotation])
	if err != nil {
		return err
	}
	grantKey, err := grantRef(carrier.Annotations[lockingv1alpha1.GrantAnnotation], w.req.Namespace)
	if err != nil {
		return err
	}
	proof := fencing.Proof(carrier.Annotations[lockingv1alpha1.ProofAnnotation])
	if pol != nil && proof == "" {
		return &fencing.Error{Reason: fencing.ReasonNoFence, Detail: fmt.Sprintf(
			"objects under GuardPolicy %q need the grant's proof in annotation %s", pol.Name, lockingv1alpha1.ProofAnnotation)}
	}
	var recorded int64
	if w.old != nil {
		// A value this webhook accepted before; unreadable means none.
		recorded, _ = fencing.ParseFence(w.old.Annotations[lockingv1alpha1.FenceAnnotation])
	}
	fw := fencing.Write{
		Resource: resource, Caller: w.req.UserInfo.Username, Fence: fence, Recorded: recorded, Now: c.Clock.Now(),
	}
	if fw.Grant, fw.Counter, err = c.registry(ctx, grantKey, resource); err != nil {
		return err
	}
	if proof == "" {
		return fencing.CheckWrite(fw)
	}
	bundle, err := c.Bundle(ctx)
	if err != nil {
		return fmt.Errorf("reading the trust bundle: %w", err)
	}
	pw := fencing.ProvenWrite{
		Proof: proof, Bundle: bundle, GrantNamespace: grantKey.Namespace, GrantName: grantKey.Name, Write: fw,
	}
	if pol != nil {
		pw.Policy, pw.PolicyGeneration = pol.Name, pol.Generation
	}
	return fencing.CheckProvenWrite(pw)
}

// registry reads the grant and the resource's counter directly from the API
// server; nil when absent.
func (c *Checker) registry(ctx context.Context, grantKey types.NamespacedName, resource string) (*fencing.Grant, *fencing.Counter, error) {
	grant := &lockingv1alpha1.LockGrant{}
	switch err := c.Reader.Get(ctx, grantKey, grant); {
	case apierrors.IsNotFound(err):
		grant = nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading grant %s: %w", grantKey, err)
	}
	counter := &lockingv1alpha1.FenceCounter{}
	counterKey := types.NamespacedName{Namespace: grantKey.Namespace, Name: lockingv1alpha1.FenceCounterName(resource)}
	switch err := c.Reader.Get(ctx, counterKey, counter); {
	case apierrors.IsNotFound(err):
		counter = nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading fence counter %s: %w", counterKey, err)
	}
	return facts.Grant(grant), facts.Counter(counter), nil
}

func (c *Checker) namespaceTerminating(ctx context.Context, name string) bool {
	if name == "" {
		return false
	}
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Namespace"))
	ns.APIVersion = "v1"
	if err := c.Reader.Get(ctx, types.NamespacedName{Name: name}, ns); err != nil {
		return false
	}
	return ns.DeletionTimestamp != nil
}

// grantRef parses "NAME" or "NAMESPACE/NAME". Resource IDs are scoped to a
// namespace, so a namespaced object takes grants of its own namespace only;
// a cluster-scoped object must name the grant's namespace.
func grantRef(s, objNamespace string) (types.NamespacedName, error) {
	ns, name, found := strings.Cut(s, "/")
	if !found {
		ns, name = objNamespace, s
	}
	if name == "" || ns == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, &fencing.Error{Reason: fencing.ReasonNoFence,
			Detail: fmt.Sprintf("the write must name its grant in annotation %s as NAME or NAMESPACE/NAME, got %q", lockingv1alpha1.GrantAnnotation, s)}
	}
	if objNamespace != "" && ns != objNamespace {
		return types.NamespacedName{}, &fencing.Error{Reason: fencing.ReasonBindingMismatch,
			Detail: fmt.Sprintf("the grant %s/%s is in another namespace; resource IDs are scoped to a namespace, so an object in %q takes grants of %q only", ns, name, objNamespace, objNamespace)}
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// labelResource is the resource of an object guarded by label: what it was
// guarded by, else what it will be. Changing it while guarded is refused.
func labelResource(w write) (string, error) {
	oldGuarded, newGuarded := labeled(w.old), labeled(w.new)
	var resource string
	switch {
	case oldGuarded:
		resource = w.old.Annotations[lockingv1alpha1.ResourceAnnotation]
		if newGuarded && w.new.Annotations[lockingv1alpha1.ResourceAnnotation] != resource {
			return "", &fencing.Error{Reason: fencing.ReasonBindingMismatch, Detail: "annotation " + lockingv1alpha1.ResourceAnnotation + " cannot change while the object is guarded"}
		}
	default:
		resource = w.new.Annotations[lockingv1alpha1.ResourceAnnotation]
	}
	if !lockingv1alpha1.ValidResourceID(resource) {
		return "", &fencing.Error{Reason: fencing.ReasonNoResource, Detail: fmt.Sprintf("guarded objects need annotation %s with a valid resource ID, got %q", lockingv1alpha1.ResourceAnnotation, resource)}
	}
	return resource, nil
}

func labeled(o *object) bool {
	return o != nil && o.Labels[lockingv1alpha1.GuardedLabel] == "true"
}

// policyResource is the resource of an object under a policy, from the
// stored object when there is one; a write that would change it is refused.
func policyResource(w write, pol *lockingv1alpha1.GuardPolicy) (string, error) {
	id := func(o *object) string { return policy.ResourceID(pol, o.Namespace, o.Name, o.Annotations) }
	var resource string
	if w.old != nil {
		resource = id(w.old)
		if w.new != nil && resource != "" && id(w.new) != resource {
			return "", &fencing.Error{Reason: fencing.ReasonBindingMismatch, Detail: "the write would change the object's resource ID"}
		}
	} else {
		resource = id(w.new)
	}
	if resource == "" {
		return "", &fencing.Error{Reason: fencing.ReasonNoResource, Detail: fmt.Sprintf("GuardPolicy %q maps the object to no valid resource ID", pol.Name)}
	}
	return resource, nil
}
