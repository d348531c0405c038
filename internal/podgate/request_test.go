package podgate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestParseRequest(t *testing.T) {
	lockOnly := map[string]string{lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19"}
	with := func(k, v string) map[string]string {
		a := map[string]string{lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19", k: v}
		return a
	}
	cases := []struct {
		name string
		a    map[string]string
		want Request
		bad  string // the annotation refused, "" for none
	}{
		{"the defaults", lockOnly, Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30}, ""},
		{"a ttl", with(lockingv1alpha1.TTLAnnotation, "2m"), Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 120}, ""},
		{"the shortest ttl", with(lockingv1alpha1.TTLAnnotation, "1s"), Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 1}, ""},
		{"the longest ttl", with(lockingv1alpha1.TTLAnnotation, "1h"), Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 3600}, ""},
		{"permits", with(lockingv1alpha1.PermitsAnnotation, "64"), Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30, Permits: 64}, ""},
		{"a lock-delay", with(lockingv1alpha1.LockDelayAnnotation, "10s"), Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30, LockDelaySeconds: 10}, ""},
		{"no lock-delay", with(lockingv1alpha1.LockDelayAnnotation, "0s"), Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30}, ""},
		{"uppercase resource", map[string]string{lockingv1alpha1.LockAnnotation: "Invoice"}, Request{}, lockingv1alpha1.LockAnnotation},
		{"trailing slash", map[string]string{lockingv1alpha1.LockAnnotation: "invoice/"}, Request{}, lockingv1alpha1.LockAnnotation},
		{"ttl below a second", with(lockingv1alpha1.TTLAnnotation, "500ms"), Request{}, lockingv1alpha1.TTLAnnotation},
		{"ttl in fractions", with(lockingv1alpha1.TTLAnnotation, "2.5s"), Request{}, lockingv1alpha1.TTLAnnotation},
		{"ttl without a unit", with(lockingv1alpha1.TTLAnnotation, "30"), Request{}, lockingv1alpha1.TTLAnnotation},
		{"ttl over an hour", with(lockingv1alpha1.TTLAnnotation, "3601s"), Request{}, lockingv1alpha1.TTLAnnotation},
		{"permits not a number", with(lockingv1alpha1.PermitsAnnotation, "two"), Request{}, lockingv1alpha1.PermitsAnnotation},
		{"permits over 64", with(lockingv1alpha1.PermitsAnnotation, "65"), Request{}, lockingv1alpha1.PermitsAnnotation},
		{"lock-delay over an hour", with(lockingv1alpha1.LockDelayAnnotation, "61m"), Request{}, lockingv1alpha1.LockDelayAnnotation},
		{"negative lock-delay", with(lockingv1alpha1.LockDelayAnnotation, "-1s"), Request{}, lockingv1alpha1.LockDelayAnnotation},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, errs := ParseRequest(c.a)
			if c.bad == "" {
				if len(errs) > 0 || got != c.want {
					t.Fatalf("got %+v, %v; want %+v", got, errs, c.want)
				}
				return
			}
			if len(errs) != 1 || !strings.HasPrefix(errs[0].Detail, "INVALID_SPEC: ") || errs[0].Field != "metadata.annotations["+c.bad+"]" {
				t.Fatalf("got %v, want one INVALID_SPEC error at %s", errs, c.bad)
			}
		})
	}
}

func TestGrantFor(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "settle-0", UID: "u1",
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: "2026-07-19T00:00:00.5Z"}},
		Spec: corev1.PodSpec{ServiceAccountName: "worker"},
	}
	g := GrantFor(p, Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30, Permits: 2, LockDelaySeconds: 5})
	if g.Name != lockingv1alpha1.GrantNameForRequest("pod-u1") || g.Spec.RequestID != "pod-u1" || g.Namespace != "billing" {
		t.Errorf("grant %s/%s with request ID %q is not named after its Pod", g.Namespace, g.Name, g.Spec.RequestID)
	}
	if g.Spec.Owner != "system:serviceaccount:billing:worker" {
		t.Errorf("owner %q", g.Spec.Owner)
	}
	if ref := PodOf(g); ref == nil || ref.Name != "settle-0" || ref.UID != "u1" {
		t.Errorf("not bound to its Pod: %+v", g.OwnerReferences)
	}
	if g.Annotations[lockingv1alpha1.RequestedAtAnnotation] != "2026-07-19T00:00:00.5Z" {
		t.Errorf("not in the queue from the Pod's admission: %v", g.Annotations)
	}
	if g.Spec.Permits != 2 || g.Spec.LockDelaySeconds != 5 || g.Spec.LeaseDurationSeconds != 30 {
		t.Errorf("spec %+v", g.Spec)
	}
	b := BoundPodOf(p)
	if b.Owner != g.Spec.Owner || b.RequestID != g.Spec.RequestID || b.RequestedAt != g.Annotations[lockingv1alpha1.RequestedAtAnnotation] || b.Gated {
		t.Errorf("the Pod's facts %+v do not match its grant", b)
	}
	if p.Spec.ServiceAccountName = ""; ServiceAccount(p) != "default" {
		t.Errorf("a Pod without a ServiceAccount runs as %q", ServiceAccount(p))
	}
}
