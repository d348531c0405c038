package integration

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A server-side dry run (kubectl --dry-run=server, dryRun=All) leaves no
// trace of the guard: it is answered as the write would be (a Shadow
// policy's note in the object returned, a denial with its reason), but it
// counts neither as a denial nor as an acceptance in the decisions metric,
// nor as a shadow denial, and emits no Event. The same writes made for real
// are counted, so the counts are live.
func TestDryRunsLeaveNoTrace(t *testing.T) {
	ns := namespace(t)
	b := as(t, "dry-b")
	const name = "dryrun-shadow"
	newPolicy(t, name, ns, lockingv1alpha1.ModeShadow, "dry-a")
	covered := map[string]string{"app": name}
	waitUntil(t, "Shadow mode records an unfenced write", func() (bool, error) {
		if err := writeCM(t, b, ns, "real-1", "unfenced", nil, covered); err != nil {
			t.Fatalf("Shadow mode refused a write: %v", err)
		}
		return strings.HasPrefix(configMap(t, ns, "real-1").Annotations[lockingv1alpha1.ShadowDenialAnnotation], "NO_FENCE"), nil
	})
	shadowDenials := func() float64 {
		return metricValue(t, "lockwarden_guardpolicy_shadow_denials_total", map[string]string{"policy": name})
	}
	decisions := func(webhook string) float64 {
		return metricValue(t, "lockwarden_guarded_write_decisions_total", map[string]string{"webhook": webhook})
	}
	shadowBefore, decidedBefore := shadowDenials(), decisions("shadow")

	// Dry runs of writes Enforce would deny, the way clients make them: a
	// create, a merge patch that brings an object under the policy, and a
	// server-side apply. Each answer carries the Shadow note, so the
	// webhook judged each; nothing is stored.
	noted := func(what string, cm *corev1.ConfigMap) {
		t.Helper()
		if !strings.HasPrefix(cm.Annotations[lockingv1alpha1.ShadowDenialAnnotation], "NO_FENCE") {
			t.Fatalf("%s: the dry run's answer carries no Shadow note: %v", what, cm.Annotations)
		}
	}
	created := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dry-create", Labels: covered}, Data: map[string]string{"result": "dry"}}
	if err := b.c.Create(t.Context(), created, client.DryRunAll); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	noted("dry-run create", created)

	if err := writeCM(t, b, ns, "dry-patch", "uncovered", nil, nil); err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": covered}, "data": map[string]string{"result": "dry"}})
	if err != nil {
		t.Fatal(err)
	}
	patched := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dry-patch"}}
	if err := b.c.Patch(t.Context(), patched, client.RawPatch(types.MergePatchType, body), client.DryRunAll); err != nil {
		t.Fatalf("dry-run merge patch: %v", err)
	}
	noted("dry-run merge patch", patched)

	body, err = json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": ns, "name": "dry-apply", "labels": covered},
		"data":     map[string]string{"result": "dry"},
	})
	if err != nil {
		t.Fatal(err)
	}
	applied := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dry-apply"}}
	if err := b.c.Patch(t.Context(), applied, client.RawPatch(types.ApplyPatchType, body), client.DryRunAll, client.FieldOwner("pipeline")); err != nil {
		t.Fatalf("dry-run server-side apply: %v", err)
	}
	noted("dry-run server-side apply", applied)

	for _, name := range []string{"dry-create", "dry-apply"} {
		if cm := configMap(t, ns, name); cm != nil {
			t.Fatalf("a dry run stored %s: %+v", name, cm.ObjectMeta)
		}
	}
	if cm := configMap(t, ns, "dry-patch"); cm.Labels["app"] != "" || cm.Annotations[lockingv1alpha1.ShadowDenialAnnotation] != "" {
		t.Fatalf("a dry-run patch was stored: %+v", cm.ObjectMeta)
	}
	if got := shadowDenials(); got != shadowBefore {
		t.Fatalf("shadow denials went from %v to %v over dry runs alone", shadowBefore, got)
	}
	if got := decisions("shadow"); got != decidedBefore {
		t.Fatalf("Shadow decisions went from %v to %v over dry runs alone", decidedBefore, got)
	}

	// The same write for real is counted and noted in an Event; the dry
	// runs, made before it, have none.
	if err := writeCM(t, b, ns, "real-2", "unfenced", nil, covered); err != nil {
		t.Fatal(err)
	}
	if got := shadowDenials(); got != shadowBefore+1 {
		t.Fatalf("shadow denials went from %v to %v over one real write", shadowBefore, got)
	}
	if got := decisions("shadow"); got != decidedBefore+1 {
		t.Fatalf("Shadow decisions went from %v to %v over one real write", decidedBefore, got)
	}
	waitUntil(t, "a ShadowDenied Event for the real write", func() (bool, error) {
		var evs eventsv1.EventList
		if err := admin.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		seen := false
		for _, e := range evs.Items {
			if e.Reason != lockingv1alpha1.GuardPolicyReasonShadowDenied {
				continue
			}
			if strings.HasPrefix(e.Regarding.Name, "dry-") {
				t.Fatalf("a dry run left an Event: %s %s", e.Regarding.Name, e.Note)
			}
			seen = seen || e.Regarding.Name == "real-2"
		}
		return seen, nil
	})

	// A dry run of a write the label guard refuses (a guarded object
	// created without a grant) is refused with its reason, and is not
	// counted as a denial; the same write for real is.
	labelBefore := decisions("label")
	guarded := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "guarded", Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"},
			Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: resource},
		}}
	}
	wantReason(t, "a dry-run create of a guarded object without a grant", b.c.Create(t.Context(), guarded(), client.DryRunAll), "NO_FENCE")
	if got := decisions("label"); got != labelBefore {
		t.Fatalf("guard decisions went from %v to %v over a dry run alone", labelBefore, got)
	}
	wantReason(t, "the same create for real", b.c.Create(t.Context(), guarded()), "NO_FENCE")
	if got := decisions("label"); got != labelBefore+1 {
		t.Fatalf("guard decisions went from %v to %v over one real write", labelBefore, got)
	}
}
