package integration

import (
	"context"
	"math"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A user who may write ConfigMaps in a namespace of its own cannot wedge
// another namespace's resource by writing a record on an object nothing
// guards: the manager's scan counts a record only where admission wrote
// it (an object guarded now, by the label or an Enforce GuardPolicy) or
// where the issuer signed it (a proof that verifies, for the fence it
// records). Here mallory writes the last fence there is (2^63-1), naming
// the victim's namespace through accepted-grant and the resource through
// the resource annotation, and a forged, unsigned proof naming another
// resource of the victim; after a scan, both resources are granted at once.
func TestForgedRecordOnAnUnguardedObjectHoldsNothingBack(t *testing.T) {
	victim, own := namespace(t), namespace(t)
	byAnnotation, byProof := "adv-floor/"+victim+"/annotation", "adv-floor/"+victim+"/proof"
	epoch := issuerEpoch(t)
	forged := fencing.FormatProof(fencing.Record{
		Namespace: victim, Resource: byProof, Owner: "system:serviceaccount:billing:mallory", Grant: "forged", LeaseID: "uid-forged",
		Fence: epoch<<fencing.EpochBits | 1000, BackendRevision: "1", IssuerEpoch: epoch, TTLSeconds: 60, KeyID: "forged-key",
	}, make([]byte, 64))
	mallory := as(t, "floor-mallory")
	for name, a := range map[string]map[string]string{
		"wedge-by-annotation": {
			lockingv1alpha1.AcceptedGrantAnnotation: victim + "/forged",
			lockingv1alpha1.AcceptedFenceAnnotation: fencing.FormatFence(math.MaxInt64),
			lockingv1alpha1.ResourceAnnotation:      byAnnotation,
		},
		"wedge-by-proof": {
			lockingv1alpha1.AcceptedGrantAnnotation: victim + "/forged",
			lockingv1alpha1.AcceptedFenceAnnotation: fencing.FormatFence(epoch<<fencing.EpochBits | 1000),
			lockingv1alpha1.AcceptedProofAnnotation: string(forged),
		},
		// The guard label set to anything but "true" guards nothing.
		"wedge-by-false-label": {
			lockingv1alpha1.AcceptedGrantAnnotation: victim + "/forged",
			lockingv1alpha1.AcceptedFenceAnnotation: fencing.FormatFence(math.MaxInt64 - 1),
			lockingv1alpha1.ResourceAnnotation:      byAnnotation,
		},
	} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: own, Name: name, Annotations: a}}
		if name == "wedge-by-false-label" {
			cm.Labels = map[string]string{lockingv1alpha1.GuardedLabel: "false"}
		}
		if err := mallory.c.Create(t.Context(), cm); err != nil {
			t.Fatalf("mallory's unguarded ConfigMap %s: %v", name, err)
		}
		// Gone after the test: hack/next-epoch.sh, which other tests run
		// on this cluster, reads every record.
		t.Cleanup(func() { _ = admin.Delete(context.Background(), cm) })
	}
	if _, err := env.Floors.Scan(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, res := range []string{byAnnotation, byProof} {
		if got := env.Floors.Floors(victim, res); len(got) != 0 {
			t.Errorf("floors of %s/%s after mallory's records: %+v; want none", victim, res, got)
		}
		g, err := acquire(t, as(t, "floor-victim"), victim, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = res })
		if err != nil {
			t.Fatal(err)
		}
		g = waitFor(t, g, "Held, or held back", func(g *lockingv1alpha1.LockGrant) bool {
			return g.Status.Phase == lockingv1alpha1.PhaseHeld || len(g.Status.Conditions) > 0 && g.Status.Conditions[0].Reason == lockingv1alpha1.LockGrantReasonFenceRegression
		})
		if g.Status.Phase != lockingv1alpha1.PhaseHeld {
			t.Errorf("the victim's grant of %s: phase %q, conditions %+v; want Held (mallory's forged record wedged it)", res, g.Status.Phase, g.Status.Conditions)
		}
	}
}

// The direct list of a resource's grants selects on spec.resource with any
// resource ID the syntax allows ("/", ".", "_", "-"): it finds exactly that
// resource's grants, never one whose ID only starts the same. A kind that
// selects on no such field is refused BadRequest, which listDirect takes
// for an older CRD and falls back on listing the namespace.
func TestGrantsSelectedByResourceField(t *testing.T) {
	ns := namespace(t)
	a := as(t, "sel-a")
	ids := []string{"a.b/c_d-e/f", "a.b/c_d-e/f2", "a.b/c_d-e", "a.b/c_d-e/f/g", "x"}
	for _, id := range ids {
		if _, err := acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = id }); err != nil {
			t.Fatalf("acquiring %s: %v", id, err)
		}
	}
	for _, id := range ids {
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list, client.InNamespace(ns), client.MatchingFields{"spec.resource": id}); err != nil {
			t.Fatalf("listing grants of %s by field: %v", id, err)
		}
		if len(list.Items) != 1 || list.Items[0].Spec.Resource != id {
			t.Fatalf("grants of %s by field: %d, want exactly its own", id, len(list.Items))
		}
	}
	var counters lockingv1alpha1.FenceCounterList
	err := admin.List(t.Context(), &counters, client.InNamespace(ns), client.MatchingFields{"spec.resource": "x"})
	if !apierrors.IsBadRequest(err) {
		t.Fatalf("a field selector on a kind that does not select on it: %v; want BadRequest", err)
	}
}
