package guardpolicy_test

import (
	"context"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/webhook/guardpolicy"
)

// An unusable policy is refused as Invalid, each cause naming the user's
// field with a detail that starts with INVALID_POLICY.
func TestUnusablePolicyNamesTheField(t *testing.T) {
	tests := []struct {
		name   string
		change func(*lockingv1alpha1.GuardPolicy)
		fields []string // none: allowed
	}{
		{"usable", func(*lockingv1alpha1.GuardPolicy) {}, nil},
		{"a selector that does not parse", func(p *lockingv1alpha1.GuardPolicy) {
			p.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
		}, []string{"spec.selector"}},
		{"an unknown placeholder", func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "{kind}-{name}" }, []string{"spec.resourceIDTemplate"}},
		{"a template that yields no resource ID", func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "{name}/x y" }, []string{"spec.resourceIDTemplate"}},
		{"holders without a name, namespace or known kind", func(p *lockingv1alpha1.GuardPolicy) {
			p.Spec.Holders = []rbacv1.Subject{{Kind: rbacv1.UserKind}, {Kind: rbacv1.ServiceAccountKind, Name: "sa"}, {Kind: "Robot", Name: "r"}}
		}, []string{"spec.holders[0].name", "spec.holders[1].namespace", "spec.holders[2].kind"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &lockingv1alpha1.GuardPolicy{}
			p.Name = "p"
			tc.change(p)
			_, err := guardpolicy.Validator{}.ValidateCreate(context.Background(), p)
			if len(tc.fields) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("%v: want Invalid", err)
			}
			st := err.(apierrors.APIStatus).Status() //nolint:errorlint // the validator returns the status itself
			if len(st.Details.Causes) != len(tc.fields) {
				t.Fatalf("causes %+v, want %v", st.Details.Causes, tc.fields)
			}
			for i, c := range st.Details.Causes {
				if c.Field != tc.fields[i] || !strings.Contains(c.Message, "INVALID_POLICY: ") {
					t.Errorf("cause %d = %s %q, want %s with INVALID_POLICY", i, c.Field, c.Message, tc.fields[i])
				}
			}
		})
	}
}
