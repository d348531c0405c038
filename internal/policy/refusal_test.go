package policy

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckGrant(t *testing.T) {
	p := &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{
		MaxLeaseDurationSeconds: 30,
		Holders: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: "w"},
			{Kind: rbacv1.GroupKind, Name: "batch"},
		},
	}}
	p.Name = "settlement"
	unlimited := p.DeepCopy()
	unlimited.Spec.MaxLeaseDurationSeconds = 0
	cases := []struct {
		name   string
		p      *lockingv1alpha1.GuardPolicy
		owner  string
		groups []string
		ttl    int32
		want   fencing.Reason
		detail string
	}{
		{"service account holder", p, "system:serviceaccount:billing:w", nil, 30, "", ""},
		{"group holder", p, "alice", []string{"batch"}, 10, "", ""},
		{"not a holder", p, "mallory", []string{"other"}, 10, fencing.ReasonNotOwner, `"mallory" is not a holder of GuardPolicy "settlement"`},
		{"not a holder, lease too long too", p, "mallory", nil, 60, fencing.ReasonNotOwner, ""},
		{"lease too long", p, "alice", []string{"batch"}, 31, fencing.ReasonInvalidSpec, `GuardPolicy "settlement" allows leases of at most 30 seconds`},
		{"no limit", unlimited, "alice", []string{"batch"}, 3600, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckGrant(c.p, c.owner, c.groups, c.ttl)
			refusal(t, err, c.want, c.detail)
			// The controller's reading of the same rule says the same.
			if why := AllowsGrant(c.p, c.owner, c.groups, c.ttl); (why == "") != (err == nil) || (err != nil && !strings.HasSuffix(err.Error(), why)) {
				t.Fatalf("AllowsGrant says %q, CheckGrant %v", why, err)
			}
		})
	}
}
