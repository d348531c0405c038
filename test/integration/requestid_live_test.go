package integration

import (
	"fmt"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A request ID the user chose that happens to start with "pod-" (the
// prefix of a gated Pod's grant) is still the user's: the owner's delete
// of its live grant is refused REQUEST_ID_LIVE like any other, or a retry
// with the ID would run the attempt again. Only a grant the manager
// requested for a Pod (stamped with its steward) is deleted by its owner.
func TestOwnerDeleteOfALiveGrantWithAPodLikeRequestIDRefused(t *testing.T) {
	ns := namespace(t)
	a := as(t, "rid-podlike")
	g, err := acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) {
		g.Spec.Resource = "adv/podlike"
		g.Spec.RequestID = "pod-nightly-2026-12-03"
	})
	if err != nil {
		t.Fatal(err)
	}
	g = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
	err = a.c.Delete(t.Context(), g.DeepCopy())
	wantReason(t, "the owner's delete of its Held grant of a chosen request ID starting with pod-", err, "REQUEST_ID_LIVE")
	if cur := get(t, g); cur.UID != g.UID || cur.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("grant after the refused delete: %+v", cur.Status)
	}
}

// Every other way the owner has to forget a live grant's request ID is
// refused and leaves the grant as it was: a delete with preconditions, a
// dry-run delete, a deletecollection of the namespace's grants, and
// patches (merge, JSON, server-side apply under several field managers)
// that would mark the ID generated, drop the request-ID label or the
// spec field, before a delete.
func TestRequestIDOfALiveGrantCannotBeForgottenByTheOwner(t *testing.T) {
	ns := namespace(t)
	a := as(t, "rid-bypass")
	g, err := acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) {
		g.Spec.Resource = "adv/bypass"
		g.Spec.RequestID = "nightly-bypass-1"
	})
	if err != nil {
		t.Fatal(err)
	}
	g = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
	// The owner may delete collections of grants in its namespace too.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deletecollection"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"deletecollection"},
	}}}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deletecollection"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: a.name}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := admin.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the owner may delete collections", func() (bool, error) {
		err := a.c.DeleteAllOf(t.Context(), &lockingv1alpha1.LockGrant{}, client.InNamespace(ns), client.MatchingLabels{"nothing": "matches"})
		return err == nil, nil
	})
	target := func() *lockingv1alpha1.LockGrant {
		return &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: g.Name}}
	}
	deletes := map[string]func() error{
		"with preconditions": func() error {
			cur := get(t, g)
			return a.c.Delete(t.Context(), target(), client.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion})
		},
		"dry run": func() error { return a.c.Delete(t.Context(), target(), client.DryRunAll) },
		"background cascade": func() error {
			return a.c.Delete(t.Context(), target(), client.PropagationPolicy(metav1.DeletePropagationBackground))
		},
		"foreground cascade": func() error {
			return a.c.Delete(t.Context(), target(), client.PropagationPolicy(metav1.DeletePropagationForeground))
		},
		"orphan": func() error {
			return a.c.Delete(t.Context(), target(), client.PropagationPolicy(metav1.DeletePropagationOrphan))
		},
		"deletecollection": func() error {
			return a.c.DeleteAllOf(t.Context(), &lockingv1alpha1.LockGrant{}, client.InNamespace(ns))
		},
		"deletecollection, by label": func() error {
			return a.c.DeleteAllOf(t.Context(), &lockingv1alpha1.LockGrant{}, client.InNamespace(ns), client.MatchingLabels{lockingv1alpha1.RequestIDLabel: "nightly-bypass-1"})
		},
	}
	for what, del := range deletes {
		err := del()
		if reason(err) != "REQUEST_ID_LIVE" {
			t.Errorf("the owner's delete %s: %v; want REQUEST_ID_LIVE", what, err)
		}
	}
	patches := map[string]client.Patch{
		"merge: mark the ID generated": client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"locking.lockwarden.io/generated-request-id":"true"}}}`)),
		"merge: drop the label":        client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"locking.lockwarden.io/request-id":null}}}`)),
		"merge: drop the spec field":   client.RawPatch(types.MergePatchType, []byte(`{"spec":{"requestID":null}}`)),
		"merge: a pod- ID":             client.RawPatch(types.MergePatchType, []byte(`{"spec":{"requestID":"pod-x"}}`)),
		"json: drop the spec field":    client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec/requestID"}]`)),
		"json: mark the ID generated":  client.RawPatch(types.JSONPatchType, []byte(`[{"op":"add","path":"/metadata/annotations/locking.lockwarden.io~1generated-request-id","value":"true"}]`)),
		"json: drop the label":         client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/labels/locking.lockwarden.io~1request-id"}]`)),
	}
	for what, p := range patches {
		if err := a.c.Patch(t.Context(), target(), p); err == nil {
			t.Errorf("the owner's patch (%s) was accepted", what)
		}
	}
	// Server-side apply, as the manager that created the grant and as new
	// ones, forced: a configuration without the request ID.
	for _, manager := range []string{"before-first-apply", "kubectl-client-side-apply", "mallory-apply"} {
		cur := get(t, g)
		body := fmt.Sprintf(`{"apiVersion":"locking.lockwarden.io/v1alpha1","kind":"LockGrant","metadata":{"name":%q,"namespace":%q,"annotations":{"locking.lockwarden.io/generated-request-id":"true"}},"spec":{"resource":%q,"leaseDurationSeconds":%d,"owner":%q}}`,
			g.Name, ns, cur.Spec.Resource, cur.Spec.LeaseDurationSeconds, cur.Spec.Owner)
		if err := a.c.Patch(t.Context(), target(), client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner(manager), client.ForceOwnership); err == nil {
			after := get(t, g)
			if after.Spec.RequestID != "nightly-bypass-1" || after.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] != "" {
				t.Errorf("apply as %s changed the request ID: %q, annotations %v", manager, after.Spec.RequestID, after.Annotations)
			}
		}
		if err := a.c.Delete(t.Context(), target()); reason(err) != "REQUEST_ID_LIVE" {
			t.Errorf("the owner's delete after an apply as %s: %v; want REQUEST_ID_LIVE", manager, err)
		}
	}
	if cur := get(t, g); cur.UID != g.UID || cur.Status.Phase != lockingv1alpha1.PhaseHeld || cur.Spec.RequestID != "nightly-bypass-1" ||
		cur.Labels[lockingv1alpha1.RequestIDLabel] != "nightly-bypass-1" || cur.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] != "" {
		t.Fatalf("grant after the attempts: %+v %+v %+v", cur.Labels, cur.Annotations, cur.Status)
	}
}
