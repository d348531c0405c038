package integration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// TestManagerDown installs the shipped webhook configurations a second time,
// pointed at a manager that does not answer (a closed port) and confined to
// one namespace, and checks what the cluster's own clients get while no
// replica answers: the scheduler binds an unguarded Pod, a workload scales
// through its scale subresource, and a drain evicts an unguarded Pod; an
// object whose guard label is not "true" stays writable. Writes to guarded
// objects, and bindings that would write lockwarden's labels or annotations
// into a Pod, stay refused (fail closed).
func TestManagerDown(t *testing.T) {
	ns := namespace(t)
	down := installDownWebhooks(t, ns)
	if err := admin.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}); err != nil {
		t.Fatal(err)
	}

	guarded := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels:      map[string]string{lockingv1alpha1.GuardedLabel: "true"},
			Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: resource, lockingv1alpha1.GrantAnnotation: "g", lockingv1alpha1.FenceAnnotation: "1"},
		}}
	}
	// The API server picks up new webhook configurations a moment later:
	// from then on a guarded write reaches the copy that does not answer.
	waitUntil(t, "the API server calls the webhooks that do not answer", func() (bool, error) {
		err := admin.Create(t.Context(), guarded("probe"))
		return err != nil && strings.Contains(err.Error(), down), nil
	})
	if err := admin.Create(t.Context(), guarded("result")); err == nil || !strings.Contains(err.Error(), down) {
		t.Fatalf("a guarded create while the manager is down: got %v, want a refusal for the webhook at %s", err, down)
	}

	// The scheduler binds an unguarded Pod.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/web"}}},
	}
	if err := admin.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	bind := func(name string, annotations map[string]string) error {
		b := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "node-1"},
		}
		return admin.SubResource("binding").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, b)
	}
	if err := bind("web", nil); err != nil {
		t.Errorf("binding an unguarded Pod while the manager is down: %v", err)
	}

	// A drain evicts it.
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}
	if err := admin.SubResource("eviction").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}, ev); err != nil {
		t.Errorf("evicting an unguarded Pod while the manager is down: %v", err)
	}

	// A workload scales.
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/web"}}},
			},
		},
	}
	if err := admin.Create(t.Context(), dep); err != nil {
		t.Fatal(err)
	}
	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	if err := admin.SubResource("scale").Update(t.Context(), dep, client.WithSubResourceBody(scale)); err != nil {
		t.Errorf("scaling an unguarded Deployment while the manager is down: %v", err)
	}

	// A guard label that is not "true" guards nothing and holds nothing up.
	if err := writeCM(t, asAdmin(), ns, "notes", "x", nil, map[string]string{lockingv1alpha1.GuardedLabel: "false"}); err != nil {
		t.Errorf("writing an object labeled %s=false while the manager is down: %v", lockingv1alpha1.GuardedLabel, err)
	}

	// A binding that would write a record into a Pod waits for the manager.
	if err := admin.Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch"}, Spec: pod.Spec}); err != nil {
		t.Fatal(err)
	}
	err := bind("batch", map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: "99"})
	if err == nil || !strings.Contains(err.Error(), down) {
		t.Errorf("a binding writing %s while the manager is down: got %v, want a refusal for the webhook at %s", lockingv1alpha1.AcceptedFenceAnnotation, err, down)
	}
}

// asAdmin is the cluster admin as an actor.
func asAdmin() *actor { return &actor{name: "admin", c: admin} }

// installDownWebhooks creates a copy of every webhook configuration of
// config/webhook/manifests.yaml whose webhooks call a closed port on this
// machine, select only namespace ns (besides their own selectors), and
// apply to namespaced objects only, so that other tests never meet them. It
// returns the host and port they call; the copies go at the end of the test.
func installDownWebhooks(t *testing.T, ns string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(env.Root, "config", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range envtest.Objects(t, manifest) {
		cfg.SetName("lw-down-" + ns + "-" + cfg.GetName())
		hooks, _, _ := unstructured.NestedSlice(cfg.Object, "webhooks")
		for i := range hooks {
			h := hooks[i].(map[string]any)
			path, _, _ := unstructured.NestedString(h, "clientConfig", "service", "path")
			h["clientConfig"] = map[string]any{"url": "https://" + host + path}
			exprs, _, _ := unstructured.NestedSlice(h, "namespaceSelector", "matchExpressions")
			exprs = append(exprs, map[string]any{"key": "kubernetes.io/metadata.name", "operator": "In", "values": []any{ns}})
			if err := unstructured.SetNestedSlice(h, exprs, "namespaceSelector", "matchExpressions"); err != nil {
				t.Fatal(err)
			}
			rules, _, _ := unstructured.NestedSlice(h, "rules")
			for _, r := range rules {
				r.(map[string]any)["scope"] = "Namespaced"
			}
			h["rules"] = rules
		}
		if err := unstructured.SetNestedSlice(cfg.Object, hooks, "webhooks"); err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := admin.Delete(context.Background(), cfg); err != nil {
				t.Errorf("deleting %s: %v", cfg.GetName(), err)
			}
		})
	}
	return host
}
