package facts_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

func TestGrantFacts(t *testing.T) {
	exp := metav1.NewMicroTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	held := lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{UID: "u1"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: "r/1", Owner: "alice"},
		Status:     lockingv1alpha1.LockGrantStatus{Phase: lockingv1alpha1.PhaseHeld, FenceToken: 7, ExpiresAt: &exp},
	}
	f := facts.Grant(&held)
	if f.UID != "u1" || f.Resource != "r/1" || f.Owner != "alice" || f.State != fencing.StateHeld || f.Fence != 7 || !f.ExpiresAt.Equal(exp.Time) {
		t.Fatalf("facts of a Held grant = %+v", f)
	}
	// A release asked for ends the grant for every enforcement point at
	// once, before the controller has answered; a waiting request that is
	// withdrawn too.
	for _, phase := range []lockingv1alpha1.LockGrantPhase{lockingv1alpha1.PhaseHeld, lockingv1alpha1.PhasePending, ""} {
		g := held.DeepCopy()
		g.Status.Phase, g.Spec.Release = phase, true
		if s := facts.Grant(g).State; s != fencing.StateReleased {
			t.Errorf("phase %q with release asked for: state %v, want Released", phase, s)
		}
	}
	g := held.DeepCopy()
	g.Status.Phase, g.Spec.Release = lockingv1alpha1.PhaseExpired, true
	if s := facts.Grant(g).State; s != fencing.StateExpired {
		t.Errorf("an expired grant whose owner then released: state %v, want Expired", s)
	}
	if facts.Grant(nil) != nil || facts.Counter(nil) != nil {
		t.Error("facts of nil objects are not nil")
	}
	c := facts.Counter(&lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Fence: 9,
		Holder: &lockingv1alpha1.FenceHolder{UID: "u1", Fence: 9}}})
	if c.Fence != 9 || c.HolderUID != "u1" {
		t.Fatalf("facts of a counter = %+v", c)
	}
}

// A grant of slot 2 of a resource with permits is, for every rule, a grant
// of the fenced resource "R#2": an object bound to slot 1 refuses it, one
// bound to slot 2 accepts it.
func TestGrantFactsOfASlot(t *testing.T) {
	exp := metav1.NewMicroTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	k := int32(2)
	g := lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{UID: "u2"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: "batch/nightly", Owner: "alice", Permits: 3},
		Status: lockingv1alpha1.LockGrantStatus{Phase: lockingv1alpha1.PhaseHeld, FenceToken: 4, ExpiresAt: &exp,
			Permit: &k, FencedResource: lockingv1alpha1.SlotResource("batch/nightly", k)},
	}
	f := facts.Grant(&g)
	if f.Resource != "batch/nightly#2" {
		t.Fatalf("resource of a slot 2 grant = %q, want batch/nightly#2", f.Resource)
	}
	w := fencing.Write{Caller: "alice", Fence: 4, Grant: f, Counter: &fencing.Counter{Fence: 4, HolderUID: "u2"}, Now: exp.Add(-time.Second)}
	w.Resource = "batch/nightly#1"
	if err := fencing.CheckWrite(w); fencing.ReasonOf(err) != fencing.ReasonBindingMismatch {
		t.Fatalf("slot 2's grant writing an object bound to slot 1: %v, want BINDING_MISMATCH", err)
	}
	w.Resource = "batch/nightly"
	if err := fencing.CheckWrite(w); fencing.ReasonOf(err) != fencing.ReasonBindingMismatch {
		t.Fatalf("slot 2's grant writing an object bound to the resource (slot 0): %v, want BINDING_MISMATCH", err)
	}
	w.Resource = "batch/nightly#2"
	if err := fencing.CheckWrite(w); err != nil {
		t.Fatalf("slot 2's grant writing its own slot's object: %v", err)
	}
}
