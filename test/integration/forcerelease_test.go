package integration

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Deleting someone else's live grant is a forced release: refused without
// the force-release verb, allowed with it, and the next grant gets a higher
// fence. Owners delete their own grants freely.
func TestForcedReleaseNeedsItsOwnPermission(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b, op := as(t, "fr-a"), as(t, "fr-b"), as(t, "fr-operator")
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "force-release"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants"}, Verbs: []string{"force-release"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "force-release"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: "fr-operator"}},
	}
	if err := admin.Create(t.Context(), role); err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(t.Context(), binding); err != nil {
		t.Fatal(err)
	}

	ga := mustAcquire(t, a, ns, 60)
	if err := b.c.Delete(t.Context(), ga); reason(err) != "NOT_OWNER" {
		t.Fatalf("B deleting A's Held grant: %v, want NOT_OWNER", err)
	}
	if g := get(t, ga); g.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("A's grant after the refused delete: %s", g.Status.Phase)
	}
	gb, err := acquire(t, b, ns, 60)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gb, lockingv1alpha1.PhasePending)
	if err := op.c.Delete(t.Context(), ga); err != nil {
		t.Fatalf("the operator's forced release: %v", err)
	}
	if gb = waitPhase(t, gb, lockingv1alpha1.PhaseHeld); gb.Status.FenceToken <= ga.Status.FenceToken {
		t.Fatalf("fence after the forced release = %d, want above %d", gb.Status.FenceToken, ga.Status.FenceToken)
	}
	if err := b.c.Delete(t.Context(), gb); err != nil {
		t.Fatalf("the owner deleting its own grant: %v", err)
	}
}
