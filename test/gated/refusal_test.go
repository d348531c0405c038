package gated

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
)

// Bad lock annotations are refused at creation with INVALID_SPEC at the
// annotation, and no Pod is created; a Pod without the annotation is not
// touched.
func TestBadLockRequestsAreRefusedWithACode(t *testing.T) {
	ns := space(t)
	cases := []struct {
		name        string
		annotations map[string]string
		nodeName    string
		at          string
	}{
		{"malformed resource", map[string]string{lockingv1alpha1.LockAnnotation: "Invoice//1"}, "", lockingv1alpha1.LockAnnotation},
		{"empty resource", map[string]string{lockingv1alpha1.LockAnnotation: ""}, "", lockingv1alpha1.LockAnnotation},
		{"oversized resource", map[string]string{lockingv1alpha1.LockAnnotation: strings.Repeat("a", 201)}, "", lockingv1alpha1.LockAnnotation},
		{"ttl 0", map[string]string{lockingv1alpha1.TTLAnnotation: "0s"}, "", lockingv1alpha1.TTLAnnotation},
		{"ttl over an hour", map[string]string{lockingv1alpha1.TTLAnnotation: "61m"}, "", lockingv1alpha1.TTLAnnotation},
		{"ttl of a fraction of a second", map[string]string{lockingv1alpha1.TTLAnnotation: "1.5s"}, "", lockingv1alpha1.TTLAnnotation},
		{"ttl not a duration", map[string]string{lockingv1alpha1.TTLAnnotation: "30"}, "", lockingv1alpha1.TTLAnnotation},
		{"65 permits", map[string]string{lockingv1alpha1.PermitsAnnotation: "65"}, "", lockingv1alpha1.PermitsAnnotation},
		{"0 permits", map[string]string{lockingv1alpha1.PermitsAnnotation: "0"}, "", lockingv1alpha1.PermitsAnnotation},
		{"negative lock-delay", map[string]string{lockingv1alpha1.LockDelayAnnotation: "-1s"}, "", lockingv1alpha1.LockDelayAnnotation},
		{"lock-delay over an hour", map[string]string{lockingv1alpha1.LockDelayAnnotation: "2h"}, "", lockingv1alpha1.LockDelayAnnotation},
		{"bound to a node at creation", nil, "node-a", "spec.nodeName"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := podSpec(ns, "bad", c.annotations)
			p.Spec.NodeName = c.nodeName
			err := admin.Create(t.Context(), p)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "INVALID_SPEC") || !strings.Contains(err.Error(), c.at) {
				t.Fatalf("create: %v, want 422 INVALID_SPEC at %s", err, c.at)
			}
			if err := admin.Get(t.Context(), client.ObjectKeyFromObject(p), &corev1.Pod{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the refused Pod exists: %v", err)
			}
		})
	}
	plain := podSpec(ns, "plain", nil)
	delete(plain.Annotations, lockingv1alpha1.LockAnnotation)
	plain = createPod(t, plain)
	if got := pod(t, plain); podgate.Gated(got) || got.Labels[lockingv1alpha1.GatedLabel] != "" {
		t.Fatalf("a Pod that names no lock was gated: %v %v", got.Spec.SchedulingGates, got.Labels)
	}
}

// A Pod that names a lock in a namespace the webhook does not serve
// (kube-system, the manager's) is refused at creation by the API server
// itself; other Pods there are not touched.
func TestUnservedNamespacesRefuseGatedPods(t *testing.T) {
	for _, ns := range []string{"kube-system", "lockwarden-system"} {
		p := podSpec(ns, "", nil)
		p.GenerateName = "settle-"
		var err error
		waitFor(t, "the policy refuses Pods that name a lock in "+ns, func() bool {
			err = admin.Create(t.Context(), p.DeepCopy())
			if err == nil {
				return false
			}
			return apierrors.IsInvalid(err) && strings.Contains(err.Error(), "INVALID_SPEC")
		})
		plain := podSpec(ns, "", nil)
		plain.GenerateName = "plain-"
		delete(plain.Annotations, lockingv1alpha1.LockAnnotation)
		if err := admin.Create(t.Context(), plain); err != nil {
			t.Fatalf("a Pod that names no lock in %s: %v", ns, err)
		}
	}
}

// A Pod acquires as its own ServiceAccount only, and only when that
// ServiceAccount may acquire; nobody but the manager creates a grant for
// someone else, and the manager only for the gated Pod it names.
func TestIdentityRules(t *testing.T) {
	ns := space(t)
	worker := podgate.Owner(ns, "worker")

	t.Run("a Pod whose ServiceAccount may not acquire", func(t *testing.T) {
		p := podSpec(ns, "stranger", nil)
		p.Spec.ServiceAccountName = "stranger"
		if err := admin.Create(t.Context(), p); reason(err) != "NOT_OWNER" {
			t.Fatalf("create: %v, want NOT_OWNER", err)
		}
	})

	holder := createPod(t, podSpec(ns, "holder", nil))
	waitStarted(t, holder)
	waiting := createPod(t, podSpec(ns, "waiting", nil))
	mine := waitGrant(t, waiting, "Pending", phase(lockingv1alpha1.PhasePending))
	waiting = pod(t, waiting)
	boundTo := func(p *corev1.Pod, uid types.UID) func(*lockingv1alpha1.LockGrant) {
		return func(g *lockingv1alpha1.LockGrant) {
			g.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: uid, Controller: ptr.To(true)}}
			g.Spec.RequestID = lockingv1alpha1.PodRequestID(string(p.UID))
			g.Annotations = map[string]string{lockingv1alpha1.RequestedAtAnnotation: p.Annotations[lockingv1alpha1.RequestedAtAnnotation]}
		}
	}
	grant := func(owner string, mutate ...func(*lockingv1alpha1.LockGrant)) *lockingv1alpha1.LockGrant {
		g := &lockingv1alpha1.LockGrant{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "claim-"},
			Spec:       lockingv1alpha1.LockGrantSpec{Resource: lock, Owner: owner, LeaseDurationSeconds: 30},
		}
		for _, m := range mutate {
			m(g)
		}
		return g
	}
	alice := as(t, "alice", "system:authenticated")
	refusals := []struct {
		name string
		c    client.Client
		g    *lockingv1alpha1.LockGrant
		want string
	}{
		{"a user claiming a ServiceAccount without a Pod", alice, grant(worker), "NOT_OWNER"},
		{"a user claiming a ServiceAccount for its gated Pod", alice, grant(worker, boundTo(waiting, waiting.UID)), "NOT_OWNER"},
		{"the manager, for an owner without a Pod", admin, grant(worker), "NOT_OWNER"},
		{"the manager, for a Pod of that name with another UID", admin, grant(worker, boundTo(waiting, "0f0f0f0f-0000-0000-0000-000000000000")), "NOT_OWNER"},
		{"the manager, for another identity than the Pod's", admin, grant(podgate.Owner(ns, "stranger"), boundTo(waiting, waiting.UID)), "NOT_OWNER"},
		{"the manager, for a Pod that already started", admin, grant(worker, boundTo(pod(t, holder), holder.UID)), "ALREADY_ENDED"},
		{"the manager, for another lock than the Pod's", admin, grant(worker, boundTo(waiting, waiting.UID), func(g *lockingv1alpha1.LockGrant) {
			g.Spec.Resource = "other"
		}), "BINDING_MISMATCH"},
		{"the manager, for an earlier place in the queue than the Pod's", admin, grant(worker, boundTo(waiting, waiting.UID), func(g *lockingv1alpha1.LockGrant) {
			g.Annotations[lockingv1alpha1.RequestedAtAnnotation] = "2000-01-01T00:00:00Z"
		}), "BINDING_MISMATCH"},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			if err := r.c.Create(t.Context(), r.g); reason(err) != r.want {
				t.Fatalf("create: %v, want %s", err, r.want)
			}
		})
	}

	t.Run("nobody but the owner and its steward renews or releases a Pod's grant", func(t *testing.T) {
		body := []byte(`{"spec":{"release":true}}`)
		target := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mine.Name}}
		if err := alice.Patch(t.Context(), target, client.RawPatch(types.MergePatchType, body)); reason(err) != "NOT_OWNER" {
			t.Fatalf("alice releasing the Pod's grant: %v, want NOT_OWNER", err)
		}
	})

	t.Run("a steward named by a client is not kept", func(t *testing.T) {
		g := grant("alice", func(g *lockingv1alpha1.LockGrant) {
			g.Annotations = map[string]string{lockingv1alpha1.StewardAnnotation: "mallory"}
		})
		must(t, alice.Create(t.Context(), g))
		if s, ok := g.Annotations[lockingv1alpha1.StewardAnnotation]; ok {
			t.Fatalf("alice's own grant has steward %q", s)
		}
	})
}
