package podgate

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Request is what a Pod's lock annotations ask for.
type Request struct {
	// Resource is the resource ID (LockAnnotation), in the Pod's namespace.
	Resource string
	// LeaseSeconds is the grant's lease duration, in seconds (TTLAnnotation).
	LeaseSeconds int32
	// Permits is the resource's number of permits (PermitsAnnotation); 0
	// when not set, an exclusive lock.
	Permits int32
	// LockDelaySeconds is the grant's lock-delay, in seconds
	// (LockDelayAnnotation).
	LockDelaySeconds int32
}

// Named reports whether a Pod with these annotations names a lock.
func Named(annotations map[string]string) bool {
	_, ok := annotations[lockingv1alpha1.LockAnnotation]
	return ok
}

// ParseRequest reads the lock request of a Pod from its annotations,
// within the bounds of a LockGrant's spec (a resource ID of the
// LockGrant's syntax, a lease of 1 s to 1 h, 1 to 64 permits, a lock-delay
// of 0 to 1 h). Each malformed annotation is a field error about
// metadata.annotations[KEY] whose detail starts with INVALID_SPEC.
func ParseRequest(annotations map[string]string) (Request, field.ErrorList) {
	path := field.NewPath("metadata", "annotations")
	var errs field.ErrorList
	r := Request{Resource: annotations[lockingv1alpha1.LockAnnotation], LeaseSeconds: lockingv1alpha1.DefaultPodLeaseSeconds}
	if !lockingv1alpha1.ValidResourceID(r.Resource) {
		errs = append(errs, deny.FieldInvalid(path.Key(lockingv1alpha1.LockAnnotation), r.Resource, fencing.ReasonInvalidSpec,
			fmt.Sprintf("must be a resource ID: one or more segments of lowercase letters, digits, '.', '_' and '-', separated by '/', at most %d bytes", lockingv1alpha1.MaxResourceLength)))
	}
	if s, ok := annotations[lockingv1alpha1.TTLAnnotation]; ok {
		n, err := seconds(s, lockingv1alpha1.MinLeaseDurationSeconds, lockingv1alpha1.MaxLeaseDurationSeconds)
		if err != nil {
			errs = append(errs, deny.FieldInvalid(path.Key(lockingv1alpha1.TTLAnnotation), s, fencing.ReasonInvalidSpec, err.Error()))
		}
		r.LeaseSeconds = n
	}
	if s, ok := annotations[lockingv1alpha1.LockDelayAnnotation]; ok {
		n, err := seconds(s, 0, lockingv1alpha1.MaxLockDelaySeconds)
		if err != nil {
			errs = append(errs, deny.FieldInvalid(path.Key(lockingv1alpha1.LockDelayAnnotation), s, fencing.ReasonInvalidSpec, err.Error()))
		}
		r.LockDelaySeconds = n
	}
	if s, ok := annotations[lockingv1alpha1.PermitsAnnotation]; ok {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil || n < 1 || n > lockingv1alpha1.MaxPermits {
			errs = append(errs, deny.FieldInvalid(path.Key(lockingv1alpha1.PermitsAnnotation), s, fencing.ReasonInvalidSpec,
				fmt.Sprintf("must be a whole number from 1 to %d", lockingv1alpha1.MaxPermits)))
		}
		r.Permits = int32(n)
	}
	return r, errs
}

// seconds parses a Go duration of whole seconds from lo to hi seconds.
func seconds(s string, lo, hi int32) (int32, error) {
	bounds := fmt.Errorf("must be a duration of whole seconds from %s to %s, such as \"30s\" or \"2m\"",
		time.Duration(lo)*time.Second, time.Duration(hi)*time.Second)
	d, err := time.ParseDuration(s)
	if err != nil || d%time.Second != 0 || d < time.Duration(lo)*time.Second || d > time.Duration(hi)*time.Second {
		return 0, bounds
	}
	return int32(d / time.Second), nil
}

// ServiceAccount is the name of the ServiceAccount a Pod runs as: its
// spec.serviceAccountName, else the deprecated spec.serviceAccount, else
// "default" (what the API server's ServiceAccount admission sets).
func ServiceAccount(pod *corev1.Pod) string {
	switch {
	case pod.Spec.ServiceAccountName != "":
		return pod.Spec.ServiceAccountName
	case pod.Spec.DeprecatedServiceAccount != "":
		return pod.Spec.DeprecatedServiceAccount
	}
	return "default"
}

// Owner is the identity a Pod of namespace ns running as ServiceAccount sa
// acquires as: that ServiceAccount's user name.
func Owner(ns, sa string) string { return serviceaccount.MakeUsername(ns, sa) }

// OwnerGroups are the groups the API server authenticates the
// ServiceAccount user owner in; nil when owner is no ServiceAccount.
func OwnerGroups(owner string) []string {
	ns, _, err := serviceaccount.SplitUsername(owner)
	if err != nil {
		return nil
	}
	return append(serviceaccount.MakeGroupNames(ns), "system:authenticated")
}

// Gated reports whether pod still carries the lock's scheduling gate.
func Gated(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == lockingv1alpha1.PodSchedulingGate {
			return true
		}
	}
	return false
}

// GrantFor is the grant the manager requests for pod, which asks for r:
// named after the Pod's UID (one grant per Pod, so a retried create is
// idempotent), owned by the Pod's ServiceAccount, controlled by the Pod
// (with its UID), and in the queue from the Pod's admission stamp.
func GrantFor(pod *corev1.Pod, r Request) *lockingv1alpha1.LockGrant {
	requestID := lockingv1alpha1.PodRequestID(string(pod.UID))
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pod.Namespace,
			Name:      lockingv1alpha1.GrantNameForRequest(requestID),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true),
			}},
		},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             r.Resource,
			Owner:                Owner(pod.Namespace, ServiceAccount(pod)),
			LeaseDurationSeconds: r.LeaseSeconds,
			LockDelaySeconds:     r.LockDelaySeconds,
			Permits:              r.Permits,
			RequestID:            requestID,
		},
	}
	if at, ok := pod.Annotations[lockingv1alpha1.RequestedAtAnnotation]; ok {
		g.Annotations = map[string]string{lockingv1alpha1.RequestedAtAnnotation: at}
	}
	return g
}

// PodOf is the Pod a grant was requested for (its controller reference to
// a Pod), or nil.
func PodOf(g *lockingv1alpha1.LockGrant) *fencing.PodRef {
	for _, ref := range g.OwnerReferences {
		if ref.APIVersion == "v1" && ref.Kind == "Pod" && ref.Controller != nil && *ref.Controller {
			return &fencing.PodRef{Name: ref.Name, UID: string(ref.UID)}
		}
	}
	return nil
}

// BoundPodOf is what admission checks a grant requested for pod against
// (fencing.CheckGrantCreate).
func BoundPodOf(pod *corev1.Pod) *fencing.BoundPod {
	return &fencing.BoundPod{
		UID:         string(pod.UID),
		Owner:       Owner(pod.Namespace, ServiceAccount(pod)),
		Lock:        pod.Annotations[lockingv1alpha1.LockAnnotation],
		RequestID:   lockingv1alpha1.PodRequestID(string(pod.UID)),
		RequestedAt: pod.Annotations[lockingv1alpha1.RequestedAtAnnotation],
		Gated:       Gated(pod),
		Deleting:    pod.DeletionTimestamp != nil,
	}
}
