package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// assertWorld is one namespace in which the resource had three grants:
// g1 (identity A, fence 1, released), g2 (identity B, fence 2, released) and
// g3 (identity A again, fence 3, Held): A is a Deployment whose replicas
// share one service account, so the stale replica that held g1 has the
// current holder's identity.
type assertWorld struct {
	ns         string
	a, b, c    *actor
	g1, g2, g3 *lockingv1alpha1.LockGrant
}

func newAssertWorld(t *testing.T) *assertWorld {
	t.Helper()
	w := &assertWorld{ns: namespace(t), a: as(t, "mx-a"), b: as(t, "mx-b"), c: as(t, "mx-c")}
	startTimeline().at(0)
	// Pods, Deployments and their subresources for every identity, as a
	// platform team's role would grant; admission decides the rest.
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "workloads"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/status", "pods/eviction"}, Verbs: []string{"*"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "deployments/status", "deployments/scale"}, Verbs: []string{"*"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "workloads"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "default"}}
	for _, o := range []client.Object{role, binding, sa} {
		if err := admin.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	w.g1 = mustAcquire(t, w.a, w.ns, 600)
	if err := release(t, w.a, w.g1); err != nil {
		t.Fatal(err)
	}
	w.g2 = mustAcquire(t, w.b, w.ns, 600)
	if err := release(t, w.b, w.g2); err != nil {
		t.Fatal(err)
	}
	w.g3 = mustAcquire(t, w.a, w.ns, 600)
	if w.g3.Status.FenceToken != 3 {
		t.Fatalf("the current grant has fence %d, want 3", w.g3.Status.FenceToken)
	}
	return w
}

// claim is what a write sets to assert grant g.
func claim(g *lockingv1alpha1.LockGrant) map[string]string {
	return map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g)}
}

// writer is one row of the matrix: who writes, with which claim (nil: the
// write asserts nothing of its own).
type writer struct {
	name  string
	who   func(*assertWorld) *actor
	claim func(*assertWorld) map[string]string
	// current marks the current holder asserting its own grant: the one
	// write that must be accepted.
	current bool
}

var writers = []writer{
	{name: "stale replica of the same identity, asserting its old grant", who: func(w *assertWorld) *actor { return w.a }, claim: func(w *assertWorld) map[string]string { return claim(w.g1) }},
	{name: "stale replica of the same identity, asserting nothing", who: func(w *assertWorld) *actor { return w.a }},
	{name: "stale holder of another identity, asserting its old grant", who: func(w *assertWorld) *actor { return w.b }, claim: func(w *assertWorld) map[string]string { return claim(w.g2) }},
	{name: "stale holder of another identity, asserting nothing", who: func(w *assertWorld) *actor { return w.b }},
	{name: "no grant, copying the holder's claim", who: func(w *assertWorld) *actor { return w.c }, claim: func(w *assertWorld) map[string]string { return claim(w.g3) }},
	{name: "no grant, asserting nothing", who: func(w *assertWorld) *actor { return w.c }},
	{name: "current holder, asserting nothing", who: func(w *assertWorld) *actor { return w.a }},
	{name: "current holder, asserting its grant", who: func(w *assertWorld) *actor { return w.a }, claim: func(w *assertWorld) map[string]string { return claim(w.g3) }, current: true},
}

// kind is the kind of guarded object an operation works on.
type kind int

const (
	kindConfigMap kind = iota
	kindPod
	kindDeployment
)

// operation is one column of the matrix. do makes the request as x with
// claim (nil: none) on the object name; the object exists unless absent.
type operation struct {
	name   string
	kind   kind
	absent bool
	// alwaysRefused: the request cannot authorize itself, so even the
	// current holder is refused: a scale or eviction cannot carry a claim
	// (the holder writes the object itself instead), and a delete needs a
	// precondition.
	alwaysRefused bool
	// gone: an accepted request deletes the object.
	gone bool
	// prepare runs before the object is captured, as the current holder.
	prepare func(t *testing.T, w *assertWorld, name string)
	do      func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error
}

var objectSeq atomic.Int64

func TestEveryWriteAssertsItsOwnFence(t *testing.T) {
	w := newAssertWorld(t)
	for _, op := range operations {
		for _, wr := range writers {
			t.Run(op.name+"/"+wr.name, func(t *testing.T) {
				name := fmt.Sprintf("obj-%d", objectSeq.Add(1))
				if !op.absent {
					w.createGuarded(t, op.kind, name)
				}
				if op.prepare != nil {
					op.prepare(t, w, name)
				}
				before := w.read(t, op.kind, name)
				var cl map[string]string
				if wr.claim != nil {
					cl = wr.claim(w)
				}
				err := op.do(t, w, wr.who(w), name, cl)
				after := w.read(t, op.kind, name)
				if wr.current && !op.alwaysRefused {
					if err != nil {
						t.Fatalf("the current holder's asserting request was refused: %v", err)
					}
					if op.gone {
						if after != nil {
							t.Fatalf("the object survived its accepted delete")
						}
						return
					}
					wantRecorded(t, after, w.ns+"/"+w.g3.Name, "3")
					if op.kind == kindConfigMap && after.(*corev1.ConfigMap).Data["result"] == "holder" && after.(*corev1.ConfigMap).Data["pruned"] != "X" && op.name != "label removal" && op.name != "annotation removal" {
						t.Fatalf("the accepted write did not land: %v", after.(*corev1.ConfigMap).Data)
					}
					return
				}
				if err == nil {
					t.Fatalf("accepted; want refused")
				}
				if r := reason(err); r == "" || strings.HasPrefix(r, "MISMATCH") {
					t.Fatalf("refused without a reason code: %v", err)
				}
				if (before == nil) != (after == nil) || (before != nil && before.GetResourceVersion() != after.GetResourceVersion()) {
					t.Fatalf("a refused request changed the object")
				}
			})
		}
	}
}

// wantRecorded checks that o records grant and fence and carries no claim.
func wantRecorded(t *testing.T, o client.Object, grant, fence string) {
	t.Helper()
	ann := o.GetAnnotations()
	if ann[lockingv1alpha1.AcceptedGrantAnnotation] != grant || ann[lockingv1alpha1.AcceptedFenceAnnotation] != fence {
		t.Fatalf("record = %s@%s, want %s@%s", ann[lockingv1alpha1.AcceptedGrantAnnotation], ann[lockingv1alpha1.AcceptedFenceAnnotation], grant, fence)
	}
	for _, k := range []string{lockingv1alpha1.GrantAnnotation, lockingv1alpha1.FenceAnnotation, lockingv1alpha1.ProofAnnotation, lockingv1alpha1.IntentAnnotation} {
		if v, ok := ann[k]; ok {
			t.Fatalf("the accepted write left its claim %s=%q on the object", k, v)
		}
	}
}

// createGuarded creates a guarded object of kind k, written by the current
// holder, so that it records g3.
func (w *assertWorld) createGuarded(t *testing.T, k kind, name string) {
	t.Helper()
	o := w.object(k, name)
	o.SetLabels(map[string]string{lockingv1alpha1.GuardedLabel: "true", "lockwarden.test/object": name})
	ann := claim(w.g3)
	ann[lockingv1alpha1.ResourceAnnotation] = resource
	ann["note"] = "kept"
	o.SetAnnotations(ann)
	if err := w.a.c.Create(t.Context(), o); err != nil {
		t.Fatalf("creating guarded %T: %v", o, err)
	}
	wantRecorded(t, w.read(t, k, name), w.ns+"/"+w.g3.Name, "3")
}

func (w *assertWorld) object(k kind, name string) client.Object {
	meta := metav1.ObjectMeta{Namespace: w.ns, Name: name}
	switch k {
	case kindPod:
		return &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "c", Image: "registry.example/settle:1"}},
		}}
	case kindDeployment:
		labels := map[string]string{"app": name}
		return &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/settle:1"}}},
			},
		}}
	}
	return &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"result": "holder"}}
}

// read returns the object as stored, nil when absent.
func (w *assertWorld) read(t *testing.T, k kind, name string) client.Object {
	t.Helper()
	o := w.object(k, name)
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: w.ns, Name: name}, o); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return o
}

// annotate sets the claim on o's annotations.
func annotate(o metav1.Object, claim map[string]string) {
	ann := o.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	for k, v := range claim {
		ann[k] = v
	}
	o.SetAnnotations(ann)
}

// metadataPatch is {"metadata":{"annotations":claim}, ...extra}.
func patchBody(t *testing.T, claim map[string]string, extra map[string]any) []byte {
	t.Helper()
	body := map[string]any{}
	for k, v := range extra {
		body[k] = v
	}
	if claim != nil {
		body["metadata"] = map[string]any{"annotations": claim}
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func escape(key string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(key) }

// updateCM re-reads the ConfigMap as x, changes it with f, sets the claim
// and updates it: the retry-on-conflict pattern, which without a new claim
// sends back whatever the stored object carries.
func updateCM(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string, f func(*corev1.ConfigMap)) error {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := x.c.Get(t.Context(), types.NamespacedName{Namespace: w.ns, Name: name}, cm); err != nil {
		return err
	}
	f(cm)
	annotate(cm, claim)
	return x.c.Update(t.Context(), cm)
}

// preDeleteCM is the write that prepares a delete: the claim with intent
// "delete" (a write that asserts nothing has no intent to carry either).
// It returns the resourceVersion to delete at: the one the write made, or
// the stored one when it was refused.
func preDeleteCM(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) string {
	t.Helper()
	if claim != nil {
		c := map[string]string{lockingv1alpha1.IntentAnnotation: fencing.IntentDelete}
		for k, v := range claim {
			c[k] = v
		}
		_ = updateCM(t, w, x, name, c, func(cm *corev1.ConfigMap) { cm.Data["result"] = "deleting" })
	}
	cm := &corev1.ConfigMap{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: w.ns, Name: name}, cm); err != nil {
		t.Fatal(err)
	}
	return cm.ResourceVersion
}

func cmRef(w *assertWorld, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}
}

var operations = []operation{
	{name: "create", absent: true, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		cm := cmRef(w, name)
		cm.Labels = map[string]string{lockingv1alpha1.GuardedLabel: "true"}
		cm.Annotations = map[string]string{lockingv1alpha1.ResourceAnnotation: resource}
		annotate(cm, claim)
		cm.Data = map[string]string{"result": "X"}
		return x.c.Create(t.Context(), cm)
	}},
	{name: "update", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		return updateCM(t, w, x, name, claim, func(cm *corev1.ConfigMap) { cm.Data["result"] = "X" })
	}},
	{name: "merge patch", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		body := patchBody(t, claim, map[string]any{"data": map[string]string{"result": "X"}})
		return x.c.Patch(t.Context(), cmRef(w, name), client.RawPatch(types.MergePatchType, body))
	}},
	{name: "strategic merge patch", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		body := patchBody(t, claim, map[string]any{"data": map[string]string{"result": "X"}})
		return x.c.Patch(t.Context(), cmRef(w, name), client.RawPatch(types.StrategicMergePatchType, body))
	}},
	{name: "JSON patch", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		ops := []map[string]any{{"op": "replace", "path": "/data/result", "value": "X"}}
		for k, v := range claim {
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + escape(k), "value": v})
		}
		body, err := json.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		return x.c.Patch(t.Context(), cmRef(w, name), client.RawPatch(types.JSONPatchType, body))
	}},
	{name: "server-side apply", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		ann := map[string]string{lockingv1alpha1.ResourceAnnotation: resource}
		for k, v := range claim {
			ann[k] = v
		}
		body, err := json.Marshal(map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": w.ns, "labels": map[string]string{lockingv1alpha1.GuardedLabel: "true"}, "annotations": ann},
			"data":     map[string]string{"result": "X"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return x.c.Patch(t.Context(), cmRef(w, name), client.RawPatch(types.ApplyPatchType, body), client.FieldOwner("settler"), client.ForceOwnership)
	}},
	{name: "server-side apply by a manager that prunes lockwarden's annotations", prepare: func(t *testing.T, w *assertWorld, name string) {
		// The pruner applied the object once with the holder's claim and
		// owns those annotations; its next apply leaves them out.
		first, _ := json.Marshal(map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": w.ns, "annotations": claim(w.g3)},
			"data":     map[string]string{"pruned": "no"},
		})
		if err := w.a.c.Patch(t.Context(), cmRef(w, name), client.RawPatch(types.ApplyPatchType, first), client.FieldOwner("pruner"), client.ForceOwnership); err != nil {
			t.Fatalf("the pruner's first apply: %v", err)
		}
	}, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		meta := map[string]any{"name": name, "namespace": w.ns}
		if claim != nil {
			meta["annotations"] = claim
		}
		body, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": map[string]string{"pruned": "X"}})
		return x.c.Patch(t.Context(), cmRef(w, name), client.RawPatch(types.ApplyPatchType, body), client.FieldOwner("pruner"), client.ForceOwnership)
	}},
	{name: "label removal", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		return updateCM(t, w, x, name, claim, func(cm *corev1.ConfigMap) { delete(cm.Labels, lockingv1alpha1.GuardedLabel) })
	}},
	{name: "annotation removal", do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		return updateCM(t, w, x, name, claim, func(cm *corev1.ConfigMap) { delete(cm.Annotations, "note") })
	}},
	{name: "delete without precondition", alwaysRefused: true, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		return x.c.Delete(t.Context(), cmRef(w, name))
	}},
	{name: "delete with precondition", gone: true, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		rv := preDeleteCM(t, w, x, name, claim)
		return x.c.Delete(t.Context(), cmRef(w, name), client.Preconditions{ResourceVersion: &rv})
	}},
	{name: "deletecollection", gone: true, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		rv := preDeleteCM(t, w, x, name, claim)
		return x.c.DeleteAllOf(t.Context(), &corev1.ConfigMap{}, client.InNamespace(w.ns),
			client.MatchingLabels{"lockwarden.test/object": name}, client.Preconditions{ResourceVersion: &rv})
	}},
	{name: "pods/status", kind: kindPod, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		pod := &corev1.Pod{}
		if err := x.c.Get(t.Context(), types.NamespacedName{Namespace: w.ns, Name: name}, pod); err != nil {
			return err
		}
		pod.Status.Message = "X"
		annotate(pod, claim)
		return x.c.Status().Update(t.Context(), pod)
	}},
	{name: "pods/status removing the guard label", kind: kindPod, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		body := patchBody(t, claim, nil)
		var patch map[string]any
		_ = json.Unmarshal(body, &patch)
		meta, _ := patch["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta["labels"] = map[string]any{lockingv1alpha1.GuardedLabel: nil}
		patch["metadata"] = meta
		body, _ = json.Marshal(patch)
		return x.c.Status().Patch(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
	}},
	{name: "pods/eviction", kind: kindPod, alwaysRefused: true, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name, Annotations: claim}}
		return x.c.SubResource("eviction").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}, ev)
	}},
	{name: "deployments/scale", kind: kindDeployment, alwaysRefused: true, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name, Annotations: claim}, Spec: autoscalingv1.ScaleSpec{Replicas: 9}}
		return x.c.SubResource("scale").Update(t.Context(), &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}, client.WithSubResourceBody(scale))
	}},
	{name: "deployments/status", kind: kindDeployment, do: func(t *testing.T, w *assertWorld, x *actor, name string, claim map[string]string) error {
		body := patchBody(t, claim, map[string]any{"status": map[string]any{"observedGeneration": 7}})
		return x.c.Status().Patch(t.Context(), &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}, client.RawPatch(types.MergePatchType, body))
	}},
}
