package integration

import (
	"testing"

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
