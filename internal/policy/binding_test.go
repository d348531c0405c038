package policy

import (
	"errors"
	"testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// refusal fails t unless err is a refusal with reason want and, when detail
// is set, exactly that detail; want "" means no error.
func refusal(t *testing.T, err error, want fencing.Reason, detail string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	var e *fencing.Error
	if !errors.As(err, &e) || e.Reason != want {
		t.Fatalf("want %s, got %v", want, err)
	}
	if detail != "" && e.Detail != detail {
		t.Fatalf("detail:\n got %q\nwant %q", e.Detail, detail)
	}
}

func TestCheckBinding(t *testing.T) {
	templated := &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{ResourceIDTemplate: "settlement/{namespace}/{name}"}}
	templated.Name = "settlement"
	annotated := &lockingv1alpha1.GuardPolicy{}
	annotated.Name = "by-annotation"
	obj := func(name, resource string) *Object {
		o := &Object{Namespace: "billing", Name: name}
		if resource != "" {
			o.Annotations = map[string]string{lockingv1alpha1.ResourceAnnotation: resource}
		}
		return o
	}
	cases := []struct {
		name            string
		p               *lockingv1alpha1.GuardPolicy
		stored, written *Object
		resource        string
		want            fencing.Reason
		detail          string
	}{
		{"create by template", templated, nil, obj("batch-1", ""), "settlement/billing/batch-1", "", ""},
		{"update by template", templated, obj("batch-1", ""), obj("batch-1", "x"), "settlement/billing/batch-1", "", ""},
		{"delete by template", templated, obj("batch-1", ""), nil, "settlement/billing/batch-1", "", ""},
		{"template yields no valid ID", templated, nil, obj("Batch_1", ""), "", fencing.ReasonNoResource,
			`GuardPolicy "settlement" maps the object to no valid resource ID`},
		{"create by annotation", annotated, nil, obj("o", "orders"), "orders", "", ""},
		{"annotation changes", annotated, obj("o", "orders"), obj("o", "invoices"), "", fencing.ReasonBindingMismatch,
			"the write would change the object's resource ID"},
		{"annotation removed", annotated, obj("o", "orders"), obj("o", ""), "", fencing.ReasonBindingMismatch, ""},
		{"stored without an ID takes none from the write", annotated, obj("o", ""), obj("o", "orders"), "", fencing.ReasonNoResource, ""},
		{"no annotation", annotated, nil, obj("o", ""), "", fencing.ReasonNoResource,
			`GuardPolicy "by-annotation" maps the object to no valid resource ID`},
		{"no object at all", annotated, nil, nil, "", fencing.ReasonNoResource, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := CheckBinding(c.p, c.stored, c.written)
			refusal(t, err, c.want, c.detail)
			if got != c.resource {
				t.Fatalf("resource %q, want %q", got, c.resource)
			}
		})
	}
}

func TestCheckOne(t *testing.T) {
	pol := func(name string) *lockingv1alpha1.GuardPolicy {
		p := &lockingv1alpha1.GuardPolicy{}
		p.Name = name
		return p
	}
	cases := []struct {
		name   string
		pols   []*lockingv1alpha1.GuardPolicy
		want   fencing.Reason
		detail string
	}{
		{"none", nil, "", ""},
		{"one", []*lockingv1alpha1.GuardPolicy{pol("a")}, "", ""},
		{"two", []*lockingv1alpha1.GuardPolicy{pol("a"), pol("b")}, fencing.ReasonBindingMismatch,
			"the object is covered by the Enforce GuardPolicies a, b; a guarded object takes one policy: make their selectors disjoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { refusal(t, CheckOne(c.pols), c.want, c.detail) })
	}
}
