package guard

import (
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// raw is a ConfigMap with these labels and annotations, as JSON.
func raw(t *testing.T, labels, annotations map[string]string) runtime.RawExtension {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "cm", "namespace": "billing", "labels": labels, "annotations": annotations},
	})
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: b}
}

func request(op admissionv1.Operation, oldObj, newObj runtime.RawExtension) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, Name: "cm", Namespace: "billing", OldObject: oldObj, Object: newObj,
	}}
}

// TestGuarding checks that a decoded request reaches the binding rules
// with the stored and written objects' facts.
func TestGuarding(t *testing.T) {
	guarded := map[string]string{lockingv1alpha1.GuardedLabel: "true"}
	res := func(id string) map[string]string { return map[string]string{lockingv1alpha1.ResourceAnnotation: id} }
	templated := &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{ResourceIDTemplate: "settlement/{namespace}/{name}"}}
	templated.Name = "settlement"
	none := runtime.RawExtension{}
	cases := []struct {
		name     string
		req      admission.Request
		pol      *lockingv1alpha1.GuardPolicy
		resource string
		stored   bool
		unguard  bool
		want     fencing.Reason
	}{
		{"label: create", request(admissionv1.Create, none, raw(t, guarded, res("orders"))), nil, "orders", false, false, ""},
		{"label: create without a resource", request(admissionv1.Create, none, raw(t, guarded, nil)), nil, "", false, false, fencing.ReasonNoResource},
		{"label: create bound to a slot", request(admissionv1.Create, none, raw(t, guarded, res("batch/nightly#2"))), nil, "batch/nightly#2", false, false, ""},
		{"label: create bound to a slot out of range", request(admissionv1.Create, none, raw(t, guarded, res("batch/nightly#64"))), nil, "", false, false, fencing.ReasonNoResource},
		{"label: update moves to another slot", request(admissionv1.Update, raw(t, guarded, res("orders#1")), raw(t, guarded, res("orders#2"))), nil, "", false, false, fencing.ReasonBindingMismatch},
		{"label: update moves the resource", request(admissionv1.Update, raw(t, guarded, res("orders")), raw(t, guarded, res("x"))), nil, "", false, false, fencing.ReasonBindingMismatch},
		{"label: unguarding update", request(admissionv1.Update, raw(t, guarded, res("orders")), raw(t, nil, nil)), nil, "orders", true, true, ""},
		{"label: delete", request(admissionv1.Delete, raw(t, guarded, res("orders")), none), nil, "orders", true, true, ""},
		{"policy: create", request(admissionv1.Create, none, raw(t, nil, nil)), templated, "settlement/billing/cm", false, false, ""},
		{"policy: delete", request(admissionv1.Delete, raw(t, nil, nil), none), templated, "settlement/billing/cm", true, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := decode(c.req)
			if err != nil {
				t.Fatal(err)
			}
			var g guarding
			if c.pol == nil {
				g, err = labelGuarding(w)
			} else {
				g, err = policyGuarding(w, c.pol, w.new != nil)
			}
			if got := fencing.ReasonOf(err); got != c.want || (c.want == "" && err != nil) {
				t.Fatalf("refusal %v, want %q", err, c.want)
			}
			if err != nil {
				return
			}
			if g.resource != c.resource || g.storedGuarded != c.stored || (c.pol == nil && g.unguard != c.unguard) || g.policy != c.pol {
				t.Fatalf("guarding %+v, want resource %q stored %v unguard %v", g, c.resource, c.stored, c.unguard)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	bad := runtime.RawExtension{Raw: []byte(`{"metadata": 1}`)}
	cases := []struct {
		name          string
		req           admission.Request
		hasOld, hasNe bool
		fails         bool
	}{
		{"create", request(admissionv1.Create, runtime.RawExtension{}, raw(t, nil, nil)), false, true, false},
		{"delete", request(admissionv1.Delete, raw(t, nil, nil), runtime.RawExtension{}), true, false, false},
		{"bad stored object", request(admissionv1.Update, bad, raw(t, nil, nil)), false, false, true},
		{"bad new object", request(admissionv1.Update, raw(t, nil, nil), bad), true, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := decode(c.req)
			if (err != nil) != c.fails {
				t.Fatalf("error %v, want one: %v", err, c.fails)
			}
			if (w.old != nil) != c.hasOld || (w.new != nil) != c.hasNe {
				t.Fatalf("old %v new %v", w.old, w.new)
			}
		})
	}
}

func TestPreconditionAndNamespace(t *testing.T) {
	rv := "42"
	opts, _ := json.Marshal(metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	cases := []struct {
		name    string
		options []byte
		want    string
	}{
		{"none", nil, ""},
		{"with resourceVersion", opts, "42"},
		{"undecodable", []byte("{"), ""},
		{"without preconditions", []byte("{}"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := request(admissionv1.Delete, runtime.RawExtension{}, runtime.RawExtension{})
			req.Options.Raw = c.options
			if got := preconditionOf(req); got != c.want {
				t.Fatalf("precondition %q, want %q", got, c.want)
			}
		})
	}
	req := request(admissionv1.Update, runtime.RawExtension{}, runtime.RawExtension{})
	req.Resource = metav1.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	if got := objectNamespace(req); got != "" {
		t.Fatalf("a Namespace object lives in %q", got)
	}
	req.Resource.Resource = "configmaps"
	if got := objectNamespace(req); got != "billing" {
		t.Fatalf("a ConfigMap lives in %q", got)
	}
}

// An override is asserted only by the write that sets it: one the stored
// object already carried (set while it was unguarded, say) asserts
// nothing.
func TestOverrideAsserted(t *testing.T) {
	const key = lockingv1alpha1.OverrideAnnotation
	none := runtime.RawExtension{}
	with := func(v string) runtime.RawExtension { return raw(t, nil, map[string]string{key: v}) }
	for _, tc := range []struct {
		name   string
		req    admission.Request
		reason string
		ok     bool
	}{
		{"set by the update", request(admissionv1.Update, raw(t, nil, nil), with("ticket 1")), "ticket 1", true},
		{"changed by the update", request(admissionv1.Update, with("ticket 1"), with("ticket 2")), "ticket 2", true},
		{"inherited", request(admissionv1.Update, with("ticket 1"), with("ticket 1")), "", false},
		{"set empty", request(admissionv1.Update, raw(t, nil, nil), with("")), "", true},
		{"on a create", request(admissionv1.Create, none, with("ticket 1")), "ticket 1", true},
		{"none", request(admissionv1.Update, raw(t, nil, nil), raw(t, nil, nil)), "", false},
	} {
		w, err := decode(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		if reason, ok := overrideAsserted(w); reason != tc.reason || ok != tc.ok {
			t.Errorf("%s: overrideAsserted() = %q, %v; want %q, %v", tc.name, reason, ok, tc.reason, tc.ok)
		}
	}
}
