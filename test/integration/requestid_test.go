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

// The owner cannot delete its live grant made with a request ID of its
// choosing, Held or waiting: the ID would go with the grant, and a retry
// with it would run the attempt again. It is refused REQUEST_ID_LIVE and
// nothing changes; released instead, the grant ends and the ID is spent: a
// retry is refused. A grant whose ID the client generated is deleted as
// before.
func TestOwnerDeleteOfALiveRequestIDGrantRefused(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "rid-del-a")
	withID := func(id string) func(*lockingv1alpha1.LockGrant) {
		return func(g *lockingv1alpha1.LockGrant) { g.Spec.RequestID = id }
	}
	held, err := acquire(t, a, ns, 30, withID("nightly-2026-12-03"))
	if err != nil {
		t.Fatal(err)
	}
	held = waitPhase(t, held, lockingv1alpha1.PhaseHeld)
	waiting, err := acquire(t, a, ns, 30, withID("nightly-2026-12-04"))
	if err != nil {
		t.Fatal(err)
	}
	waiting = waitFor(t, waiting, "queued", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase == lockingv1alpha1.PhasePending })

	for _, g := range []*lockingv1alpha1.LockGrant{held, waiting} {
		err := a.c.Delete(t.Context(), g.DeepCopy())
		wantReason(t, "the owner's delete of its "+string(g.Status.Phase)+" grant", err, "REQUEST_ID_LIVE")
		if !strings.Contains(err.Error(), g.Spec.RequestID) || !strings.Contains(err.Error(), "spec.release") {
			t.Fatalf("refusal %q names neither the request ID nor the way to release", err)
		}
		if cur := get(t, g); cur == nil || cur.UID != g.UID || cur.Status.Phase != g.Status.Phase {
			t.Fatalf("grant %s after the refused delete: %+v", g.Name, cur)
		}
	}

	if err := release(t, a, held); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, held, lockingv1alpha1.PhaseReleased)
	if _, err := acquire(t, a, ns, 30, withID("nightly-2026-12-03")); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("a retry with the released grant's request ID: %v; want it refused (AlreadyExists)", err)
	}
	// Ended, it may be deleted (the controller does, once recorded).
	if err := a.c.Delete(t.Context(), get(t, held)); err != nil {
		t.Fatalf("the owner's delete of its ended grant: %v", err)
	}

	generated, err := acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) {
		g.Spec.RequestID = "generated-7f3a"
		g.Annotations = map[string]string{lockingv1alpha1.GeneratedRequestIDAnnotation: "true"}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.Delete(t.Context(), generated); err != nil {
		t.Fatalf("the owner's delete of its live grant of a generated request ID: %v", err)
	}
}
