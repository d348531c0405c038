package integration

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A create whose response was lost is retried with the same request ID: the
// retry finds the first grant, by name or by label, and never queues a
// second one.
func TestLostAcquireResponseRecoveredByRequestID(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a := as(t, "rid-a")
	tl.at(0)
	withID := func(g *lockingv1alpha1.LockGrant) { g.Spec.RequestID = "settlement-7-run-1" }
	first, err := acquire(t, a, ns, 30, withID)
	if err != nil {
		t.Fatal(err)
	}
	if want := lockingv1alpha1.GrantNameForRequest("settlement-7-run-1"); first.Name != want {
		t.Fatalf("grant name = %q, want %q derived from the request ID", first.Name, want)
	}
	_, err = acquire(t, a, ns, 30, withID)
	if !apierrors.IsAlreadyExists(err) {
		t.Fatalf("retried create: %v, want AlreadyExists", err)
	}
	var list lockingv1alpha1.LockGrantList
	if err := a.c.List(t.Context(), &list, client.InNamespace(ns), client.MatchingLabels{lockingv1alpha1.RequestIDLabel: "settlement-7-run-1"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].UID != first.UID {
		t.Fatalf("lookup by request ID found %d grants, want exactly the first", len(list.Items))
	}
	if g := waitPhase(t, first, lockingv1alpha1.PhaseHeld); g.Status.FenceToken != 1 {
		t.Fatalf("fence = %d, want 1", g.Status.FenceToken)
	}
	_, err = acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) {
		g.Spec.RequestID, g.GenerateName, g.Name = "other-request", "", "chosen-name"
	})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.name") || !strings.Contains(err.Error(), "INVALID_SPEC: ") {
		t.Fatalf("create with a request ID under another name: %v, want Invalid naming metadata.name with INVALID_SPEC", err)
	}
}
