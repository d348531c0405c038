package grantplan

import (
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A Held grant whose fence's epoch was revoked ends Revoked with the
// reason RevokedEpoch, and its counter no longer names it: the counter
// write that frees the resource comes with it, before its status.
func TestDecideRevokesAHolderOfARevokedEpoch(t *testing.T) {
	a := held(grant("a", 0, 30), fenceIn(2, 5), 30)
	f := Facts{Now: sec(1), Resource: res, Counter: counter(fenceIn(2, 5), &a), Grants: []lockingv1alpha1.LockGrant{a},
		Epoch: 3, Revoked: []int64{2}}
	p := Decide(f)
	s := statusOf(p, "a")
	if s == nil || s.Phase != lockingv1alpha1.PhaseRevoked || readyReason(s) != lockingv1alpha1.LockGrantReasonRevokedEpoch || s.EndedAt == nil {
		t.Fatalf("a = %+v; want Revoked with reason %s", s, lockingv1alpha1.LockGrantReasonRevokedEpoch)
	}
	if p.Counter == nil || p.Counter.Holder != nil || p.Counter.Fence != fenceIn(2, 5) {
		t.Fatalf("counter write %+v; want the resource freed, its fence kept", p.Counter)
	}
	if len(p.Events) != 1 || !p.Events[0].Warning || p.Events[0].Reason != lockingv1alpha1.LockGrantReasonRevokedEpoch {
		t.Fatalf("events %+v; want one Warning %s", p.Events, lockingv1alpha1.LockGrantReasonRevokedEpoch)
	}
	if ws := CounterWrites(f, p); len(ws) != 1 || ws[0].Slot != 0 {
		t.Fatalf("counter writes %+v; want slot 0's", ws)
	}
}

// A request its GuardPolicy does not allow is refused with the policy's
// reason and never granted, though it is first in line and the resource
// is free; the next request, which the policy allows, is granted.
func TestDecideNeverGrantsARequestItsPolicyDenies(t *testing.T) {
	pol := &lockingv1alpha1.GuardPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Generation: 4},
		Spec:       lockingv1alpha1.GuardPolicySpec{Holders: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "owner-c"}}},
	}
	b, c := grant("b", 0.1, 5), grant("c", 0.2, 5)
	b.Spec.Policy, c.Spec.Policy = "billing", "billing"
	p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(7, nil), Grants: []lockingv1alpha1.LockGrant{b, c},
		Policies: map[string]*lockingv1alpha1.GuardPolicy{"billing": pol}})
	s := statusOf(p, "b")
	if s == nil || s.Phase != lockingv1alpha1.PhaseRevoked || readyReason(s) != lockingv1alpha1.LockGrantReasonPolicyDenied || s.FenceToken != 0 {
		t.Fatalf("b = %+v; want refused with reason %s and no fence", s, lockingv1alpha1.LockGrantReasonPolicyDenied)
	}
	if c := findCond(s, lockingv1alpha1.ConditionReady); !strings.Contains(c.Message, `"owner-b" is not a holder of GuardPolicy "billing"`) {
		t.Fatalf("b's Ready says %q; want the policy's reason", c.Message)
	}
	if got := grantedNames(p); !slices.Equal(got, []string{"c"}) || p.Counter == nil || p.Counter.Holder.Name != "c" || p.Counter.Fence != 8 {
		t.Fatalf("granted %v, counter %+v; want c with fence 8, never b", got, p.Counter)
	}
	if p.PolicyGenerations["billing"] != 4 {
		t.Fatalf("policy generations %v; want billing at 4 for c's record", p.PolicyGenerations)
	}
}

// A waiter that withdraws its request (a release before it was granted)
// leaves the line: it ends Released as Cancelled, never granted, and the
// waiters behind it are served in FIFO order, the next one granted.
func TestDecideWithdrawnWaiterLeavesTheLine(t *testing.T) {
	a := held(grant("a", 0, 5), 7, 5)
	b, c, d := queued("b", 0.1, 0), queued("c", 0.2, 1), queued("d", 0.3, 2)
	b.Spec.Release = true
	// Listed out of order: FIFO is by admission time.
	f := Facts{Now: sec(1), Resource: res, Counter: counter(7, &a), Grants: []lockingv1alpha1.LockGrant{d, b, a, c}}
	p := Decide(f)
	s := statusOf(p, "b")
	if s == nil || s.Phase != lockingv1alpha1.PhaseReleased || readyReason(s) != lockingv1alpha1.LockGrantReasonCancelled || s.QueuePosition != nil {
		t.Fatalf("b = %+v; want Released (%s), out of the queue", s, lockingv1alpha1.LockGrantReasonCancelled)
	}
	if s := statusOf(p, "c"); s == nil || s.QueuePosition == nil || *s.QueuePosition != 0 {
		t.Fatalf("c = %+v; want next in line", s)
	}
	if len(p.Granted) != 0 {
		t.Fatalf("granted %v while a holds", grantedNames(p))
	}

	// a releases: c, not b, is granted, and d is next in line.
	f = applied(f, p)
	f.Now, f.Grants = sec(2), written(f.Grants, p)
	for i := range f.Grants {
		if f.Grants[i].Name == "a" {
			f.Grants[i].Spec.Release = true
		}
	}
	p = Decide(f)
	if got := grantedNames(p); !slices.Equal(got, []string{"c"}) || p.Counter == nil || p.Counter.Holder.Name != "c" || p.Counter.Fence != 8 {
		t.Fatalf("granted %v, counter %+v; want c with fence 8", got, p.Counter)
	}
	if s := statusOf(p, "d"); s == nil || s.QueuePosition == nil || *s.QueuePosition != 0 {
		t.Fatalf("d = %+v; want next in line", s)
	}
	if s := statusOf(p, "b"); s != nil {
		t.Fatalf("b written again: %+v", s)
	}
}

// written returns grants with the statuses p writes in place.
func written(grants []lockingv1alpha1.LockGrant, p Plan) []lockingv1alpha1.LockGrant {
	out := slices.Clone(grants)
	for _, g := range p.Statuses {
		if i := slices.IndexFunc(out, func(c lockingv1alpha1.LockGrant) bool { return c.UID == g.UID }); i >= 0 {
			out[i] = *g.DeepCopy()
		}
	}
	return out
}
