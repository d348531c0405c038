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
