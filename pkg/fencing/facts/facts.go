// Package facts maps lockwarden's Kubernetes objects (LockGrant, FenceCounter)
// to the facts the rules of package fencing judge, for every enforcement
// point: the admission webhooks, and a verifier outside the cluster that
// reads the registry through the Kubernetes API. It is the only place that
// maps API phases to fencing states, including the rule that the
// FenceCounter is the holder of record: a counter that names a grant with
// its lease end (spec.holder.expiresAt) says all a write under that grant is
// judged on, so a release takes effect at the controller's swap of the
// counter. A grant the counter does not name is judged on the grant itself,
// where one whose owner asked to release admits nothing more.
//
// A verifier must read the counter (and, when the counter does not name the
// grant, the grant) linearizably (a direct read from the API server, never
// an informer cache): ReadRegistry does. The one exception is an
// acceptance: facts built with Registry from a cached counter that names
// the grant (HolderGrant) may accept a write through
// fencing.AcceptFromCache, which never refuses; everything else is decided
// on ReadRegistry's facts.
package facts

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// NamespaceTerminating reports whether namespace name is being deleted, the
// fact the rules that let records go with their namespace judge
// (fencing.CheckCounterDelete, fencing.CheckGrantDelete, the delete of a
// guarded object). An empty name (a cluster-scoped object) is no namespace:
// false.
func NamespaceTerminating(ctx context.Context, r client.Reader, name string) (bool, error) {
	if name == "" {
		return false, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: name}, ns); err != nil {
		return false, fmt.Errorf("reading namespace %s: %w", name, err)
	}
	return ns.DeletionTimestamp != nil, nil
}

// MayAcquire asks the API server's authorizer (a SubjectAccessReview
// created with c) whether user, authenticated in groups, may create
// LockGrants in namespace ns: the fact fencing.CheckGatedPod and
// fencing.CheckGrantCreate judge the owner of a lock-gated Pod's grant on.
func MayAcquire(ctx context.Context, c client.Client, ns, user string, groups []string) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: "create", Group: lockingv1alpha1.GroupVersion.Group, Resource: "lockgrants",
		},
	}}
	if err := c.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("asking whether %s may create lockgrants in %s: %w", user, ns, err)
	}
	return sar.Status.Allowed, nil
}

// ReadRegistry reads the facts a write that names grant ns/name is judged
// on, for the FenceCounter of resource (a fenced resource ID: a resource, or
// one slot "ID#k" of a resource with permits) in ns, with r. It reads the
// counter first; when the counter names the grant with its lease (Registry),
// that one read is all, and the accepting path of a guarded write costs one
// round trip. Otherwise it reads the grant as well, for the reason of the
// refusal (or for a counter written before it carried the lease). r must
// read from the API server (for example a client built with client.New, not
// a manager's cached client): a stale counter could make a superseded write
// look current. nil facts for an object that does not exist.
func ReadRegistry(ctx context.Context, r client.Reader, ns, name, resource string) (*fencing.Grant, *fencing.Counter, error) {
	counter := &lockingv1alpha1.FenceCounter{}
	key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(resource)}
	switch err := r.Get(ctx, key, counter); {
	case apierrors.IsNotFound(err):
		counter = nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading fence counter %s: %w", key, err)
	}
	if HolderGrant(counter, name) != nil {
		g, c := Registry(name, nil, counter)
		return g, c, nil
	}
	grant := &lockingv1alpha1.LockGrant{}
	switch err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, grant); {
	case apierrors.IsNotFound(err):
		grant = nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading grant %s/%s: %w", ns, name, err)
	}
	g, c := Registry(name, grant, counter)
	return g, c, nil
}

// Registry returns the facts a write that names grant name is judged on,
// from the resource's counter and the grant as read (either may be nil):
// the counter's own account of its holder when it names that grant with its
// lease (HolderGrant), otherwise the grant's (Grant).
//
// Why the counter alone is enough: a grant holds exactly while the counter
// names it, the counter moves only by compare-and-swap, and every end of a
// holder (release, expiry, revocation, a lapsed session, deletion) moves
// the counter before the grant's status says so. A grant the counter names
// with an unexpired lease therefore holds, whatever its status still says;
// one it does not name does not. A release takes effect in admission with
// the counter's swap, milliseconds after the owner asked for it, before any
// successor can hold.
func Registry(name string, grant *lockingv1alpha1.LockGrant, counter *lockingv1alpha1.FenceCounter) (*fencing.Grant, *fencing.Counter) {
	if g := HolderGrant(counter, name); g != nil {
		return g, Counter(counter)
	}
	return Grant(grant), Counter(counter)
}

// HolderGrant is the grant named name as the counter records it while it
// holds: Held, with the counter's fence, owner and lease end. nil when the
// counter does not name that grant or does not record its lease (written
// before counters carried it). A lease end that cannot be read gives a
// lease that is already over (fail closed).
func HolderGrant(c *lockingv1alpha1.FenceCounter, name string) *fencing.Grant {
	if c == nil || c.Spec.Holder == nil || c.Spec.Holder.Name != name {
		return nil
	}
	h := c.Spec.Holder
	end, ok, err := h.LeaseEnd()
	if !ok {
		return nil
	}
	if err != nil {
		end = time.Time{}
	}
	return &fencing.Grant{UID: h.UID, Resource: c.Spec.Resource, Owner: h.Owner, State: fencing.StateHeld, Fence: h.Fence, ExpiresAt: end}
}

// Grant returns the fencing facts of a LockGrant; nil for nil. Its steward
// is the one admission stamped (StewardAnnotation). Its resource
// is the grant's fenced resource ID (LockGrant.HeldFencedResource): for a
// grant of a resource with permits, the slot it holds, so that an object or
// row bound to another slot refuses it (BINDING_MISMATCH).
func Grant(g *lockingv1alpha1.LockGrant) *fencing.Grant {
	if g == nil {
		return nil
	}
	f := &fencing.Grant{
		UID:      string(g.UID),
		Resource: g.HeldFencedResource(),
		Owner:    g.Spec.Owner,
		Steward:  g.Annotations[lockingv1alpha1.StewardAnnotation],
		State:    State(g.Status.Phase),
		Fence:    g.Status.FenceToken,
	}
	if g.Status.ExpiresAt != nil {
		f.ExpiresAt = g.Status.ExpiresAt.Time
	}
	if g.Spec.Release && (f.State == fencing.StateHeld || f.State == fencing.StatePending) {
		// The owner asked to release (or withdraw): judged on the grant
		// itself, from that write on it admits no more writes, renewals
		// or releases, even before the controller has answered. Where
		// the counter still names it with its lease (Registry), writes
		// are judged on the counter until the controller's swap, which
		// comes before any successor holds.
		f.State = fencing.StateReleased
	}
	return f
}

// State maps a LockGrant phase to a fencing state; an unset phase (not yet
// seen by the controller) is Pending.
func State(p lockingv1alpha1.LockGrantPhase) fencing.State {
	switch p {
	case lockingv1alpha1.PhaseHeld:
		return fencing.StateHeld
	case lockingv1alpha1.PhaseExpired:
		return fencing.StateExpired
	case lockingv1alpha1.PhaseReleased:
		return fencing.StateReleased
	case lockingv1alpha1.PhaseTimedOut:
		return fencing.StateTimedOut
	case lockingv1alpha1.PhaseRevoked:
		return fencing.StateRevoked
	}
	return fencing.StatePending
}

// Counter returns the fencing facts of a FenceCounter; nil for nil.
func Counter(c *lockingv1alpha1.FenceCounter) *fencing.Counter {
	if c == nil {
		return nil
	}
	f := &fencing.Counter{Fence: c.Spec.Fence}
	if c.Spec.Holder != nil {
		f.HolderUID = c.Spec.Holder.UID
	}
	return f
}

// ImmutableGrantAnnotations are the annotations admission stamps on a
// LockGrant when it is created, which nobody may change afterwards; the
// request-ID label (RequestIDLabel) is immutable too.
var ImmutableGrantAnnotations = []string{
	lockingv1alpha1.RequestedAtAnnotation, lockingv1alpha1.OwnerGroupsAnnotation, lockingv1alpha1.StewardAnnotation,
	lockingv1alpha1.ReusedRequestIDAnnotation, lockingv1alpha1.GeneratedRequestIDAnnotation,
}

// GrantUpdate returns the facts of caller's update of LockGrant oldG into
// newG (not a status write), for fencing.CheckGrantUpdate; administer asks
// whether caller has fencing.AdministerVerb on the grant. Immutable names
// the changed immutable metadata as field paths
// (metadata.annotations[KEY], metadata.labels[KEY]).
func GrantUpdate(caller string, oldG, newG *lockingv1alpha1.LockGrant, administer func() (bool, error)) fencing.GrantUpdate {
	u := fencing.GrantUpdate{
		Caller: caller, Grant: *Grant(oldG), Ended: oldG.Status.Phase.Final(),
		Renew: newG.Spec.Renewals > oldG.Spec.Renewals, Release: newG.Spec.Release, ReleaseChanged: newG.Spec.Release != oldG.Spec.Release,
		MetadataChanged: GrantMetadataChanged(oldG, newG), Administer: administer,
	}
	for _, a := range ImmutableGrantAnnotations {
		if oldG.Annotations[a] != newG.Annotations[a] {
			u.Immutable = append(u.Immutable, "metadata.annotations["+a+"]")
		}
	}
	if l := lockingv1alpha1.RequestIDLabel; oldG.Labels[l] != newG.Labels[l] {
		u.Immutable = append(u.Immutable, "metadata.labels["+l+"]")
	}
	return u
}

// GrantMetadataChanged reports whether an update changes a grant's labels,
// annotations, finalizers or owner references (a finalizer or an owner
// reference of someone else's would keep the owner from deleting its grant,
// or hand it to the garbage collector).
func GrantMetadataChanged(oldG, newG *lockingv1alpha1.LockGrant) bool {
	return !maps.Equal(oldG.Labels, newG.Labels) || !maps.Equal(oldG.Annotations, newG.Annotations) ||
		!slices.Equal(oldG.Finalizers, newG.Finalizers) || !equality.Semantic.DeepEqual(oldG.OwnerReferences, newG.OwnerReferences)
}
