package gatedpod

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
)

// An admitted Pod is held back by exactly one lock gate, beside any gate of
// its own, labeled for the manager's cache, stamped with its admission
// time, and rid of any annotation only the manager writes.
func TestGate(t *testing.T) {
	now := time.Date(2026, 7, 19, 10, 0, 0, 500, time.UTC)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			lockingv1alpha1.LockAnnotation:        "invoice-batch/2026-07-19",
			lockingv1alpha1.FenceAnnotation:       "999",
			lockingv1alpha1.GrantAnnotation:       "forged",
			lockingv1alpha1.RequestedAtAnnotation: "2000-01-01T00:00:00Z",
		}},
		Spec: corev1.PodSpec{SchedulingGates: []corev1.PodSchedulingGate{{Name: "example.com/quota"}}},
	}
	gate(pod, now)
	gate(pod, now) // reinvoked: still one gate
	if len(pod.Spec.SchedulingGates) != 2 || !podgate.Gated(pod) || pod.Spec.SchedulingGates[0].Name != "example.com/quota" {
		t.Errorf("gates %v, want the Pod's own and one lock gate", pod.Spec.SchedulingGates)
	}
	if pod.Labels[lockingv1alpha1.GatedLabel] != "true" {
		t.Errorf("labels %v", pod.Labels)
	}
	if got := pod.Annotations[lockingv1alpha1.RequestedAtAnnotation]; got != "2026-07-19T10:00:00.0000005Z" {
		t.Errorf("admission time %q", got)
	}
	for _, a := range managerAnnotations {
		if v, ok := pod.Annotations[a]; ok {
			t.Errorf("the creator's %s=%q was kept", a, v)
		}
	}
}
