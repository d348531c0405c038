package policy

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestValidate(t *testing.T) {
	good := func() *lockingv1alpha1.GuardPolicy {
		return &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{
			Resources:          []lockingv1alpha1.GuardedResource{{Resource: "configmaps"}},
			Selector:           &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
			ResourceIDTemplate: "settlement/{namespace}/{name}",
			Holders:            []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: "w"}},
		}}
	}
	if err := Validate(good()); err != nil {
		t.Fatalf("a valid policy: %v", err)
	}
	bad := map[string]func(*lockingv1alpha1.GuardPolicy){
		"bad selector operator": func(p *lockingv1alpha1.GuardPolicy) {
			p.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}
		},
		"unknown placeholder":   func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "x/{nope}" },
		"unclosed placeholder":  func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "x/{name" },
		"invalid characters":    func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "X Y/{name}" },
		"path traversal":        func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "../{name}" },
		"unknown holder kind":   func(p *lockingv1alpha1.GuardPolicy) { p.Spec.Holders[0].Kind = "Robot" },
		"service account no ns": func(p *lockingv1alpha1.GuardPolicy) { p.Spec.Holders[0].Namespace = "" },
		"holder without name":   func(p *lockingv1alpha1.GuardPolicy) { p.Spec.Holders[0].Name = "" },
	}
	for name, mutate := range bad {
		p := good()
		mutate(p)
		if err := Validate(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestRefusals(t *testing.T) {
	p := &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{
		ResourceIDTemplate: "x/{nope}",
		Holders:            []rbacv1.Subject{{Kind: "Robot", Name: "r"}},
	}}
	errs := Refusals(p)
	if len(errs) != 2 {
		t.Fatalf("got %v, want two refusals", errs)
	}
	for _, e := range errs {
		if !strings.HasPrefix(e.Detail, "INVALID_POLICY: ") {
			t.Errorf("%s: detail %q does not start with the reason", e.Field, e.Detail)
		}
	}
	good := &lockingv1alpha1.GuardPolicy{}
	if errs := Refusals(good); len(errs) != 0 {
		t.Fatalf("an empty policy: %v", errs)
	}
}

// TestCoversAll: a policy covers every object of a kind in a namespace only
// when its selector, if any, selects everything; a scale, eviction or binding
// request, which carries none of the object's labels, is judged by the
// policy's own webhook only then.
func TestCoversAll(t *testing.T) {
	policy := func(ns []string, sel *metav1.LabelSelector) *lockingv1alpha1.GuardPolicy {
		return &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{
			Resources:  []lockingv1alpha1.GuardedResource{{APIGroup: "apps", Resource: "deployments"}},
			Namespaces: ns, Selector: sel,
		}}
	}
	cases := []struct {
		name string
		p    *lockingv1alpha1.GuardPolicy
		ns   string
		res  string
		want bool
	}{
		{"no selector", policy(nil, nil), "billing", "deployments", true},
		{"empty selector", policy(nil, &metav1.LabelSelector{}), "billing", "deployments", true},
		{"in its namespace", policy([]string{"billing"}, nil), "billing", "deployments", true},
		{"another namespace", policy([]string{"billing"}, nil), "web", "deployments", false},
		{"another kind", policy(nil, nil), "billing", "statefulsets", false},
		{"a selector", policy(nil, &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}), "billing", "deployments", false},
		{"a selector that label-less objects match", policy(nil, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpDoesNotExist}}}), "billing", "deployments", false},
	}
	for _, c := range cases {
		got, err := CoversAll(c.p, "apps", c.res, c.ns)
		if err != nil || got != c.want {
			t.Errorf("%s: CoversAll = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}
