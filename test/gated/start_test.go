package gated

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
)

// A Pod that names a lock is created gated and labeled; its grant is
// requested as its ServiceAccount, bound to it, with the manager as
// steward; it starts only in the write that gives it its fence, and its
// Events say why it waited and what it holds.
func TestGatedPodStartsWithItsFence(t *testing.T) {
	ns := space(t)
	seen := recordPods(t, ns)
	p := createPod(t, podSpec(ns, "settle-0", nil))

	waitFor(t, "the watch saw the Pod", func() bool { return len(seen.all()) > 0 })
	created := seen.all()[0]
	if !slices.Contains(created.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: lockingv1alpha1.PodSchedulingGate}) {
		t.Fatalf("the Pod was admitted without the gate: %v", created.Spec.SchedulingGates)
	}
	if created.Labels[lockingv1alpha1.GatedLabel] != "true" || created.Annotations[lockingv1alpha1.RequestedAtAnnotation] == "" {
		t.Fatalf("the Pod was not labeled and stamped: labels %v, annotations %v", created.Labels, created.Annotations)
	}

	g := waitGrant(t, p, "Held", phase(lockingv1alpha1.PhaseHeld))
	if want := podgate.Owner(ns, "worker"); g.Spec.Owner != want {
		t.Errorf("grant owner %q, want the Pod's ServiceAccount %q", g.Spec.Owner, want)
	}
	if ref := podgate.PodOf(g); ref == nil || ref.Name != p.Name || ref.UID != string(p.UID) {
		t.Errorf("grant is not bound to its Pod: %+v", g.OwnerReferences)
	}
	if g.Annotations[lockingv1alpha1.StewardAnnotation] == "" {
		t.Errorf("grant has no steward: %v", g.Annotations)
	}
	if g.Annotations[lockingv1alpha1.RequestedAtAnnotation] != created.Annotations[lockingv1alpha1.RequestedAtAnnotation] {
		t.Errorf("grant requested at %q, the Pod was admitted at %q", g.Annotations[lockingv1alpha1.RequestedAtAnnotation], created.Annotations[lockingv1alpha1.RequestedAtAnnotation])
	}
	if g.Spec.Resource != lock || g.Spec.LeaseDurationSeconds != lockingv1alpha1.DefaultPodLeaseSeconds {
		t.Errorf("grant spec %+v, want resource %s and the default lease", g.Spec, lock)
	}

	s := waitStarted(t, p)
	if fenceOf(t, s) != g.Status.FenceToken || s.Annotations[lockingv1alpha1.GrantAnnotation] != g.Name ||
		s.Annotations[lockingv1alpha1.GrantUIDAnnotation] != string(g.UID) || s.Annotations[lockingv1alpha1.ProofAnnotation] != g.Status.Proof ||
		s.Annotations[lockingv1alpha1.FencedResourceAnnotation] != lock {
		t.Errorf("started Pod carries %v, want grant %s, uid %s, fence %d and its proof", s.Annotations, g.Name, g.UID, g.Status.FenceToken)
	}
	if g.Status.Proof == "" {
		t.Errorf("the grant has no proof to carry")
	}
	// Every version the API server stored: none ungated without the fence.
	waitFor(t, "the watch saw the start", func() bool {
		return slices.ContainsFunc(seen.all(), func(v corev1.Pod) bool { return started(&v) })
	})
	for _, v := range seen.all() {
		if started(&v) && v.Annotations[lockingv1alpha1.FenceAnnotation] != strconv.FormatInt(g.Status.FenceToken, 10) {
			t.Fatalf("version %s of the Pod is ungated without its fence: %v", v.ResourceVersion, v.Annotations)
		}
	}
	waitEvent(t, p, lockingv1alpha1.GatedPodReasonWaiting)
	waitEvent(t, p, lockingv1alpha1.GatedPodReasonGranted)
}

// waitFor polls ok until it holds or a deadline passes.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return ok(), nil
	})
	if err != nil {
		t.Fatalf("never: %s", what)
	}
}
