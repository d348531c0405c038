package k8s_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/k8s"
)

func TestGrantFacts(t *testing.T) {
	exp := metav1.NewMicroTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	held := lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{UID: "u1"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: "r/1", Owner: "alice"},
		Status:     lockingv1alpha1.LockGrantStatus{Phase: lockingv1alpha1.PhaseHeld, FenceToken: 7, ExpiresAt: &exp},
	}
	f := k8s.Grant(&held)
	if f.UID != "u1" || f.Resource != "r/1" || f.Owner != "alice" || f.State != fencing.StateHeld || f.Fence != 7 || !f.ExpiresAt.Equal(exp.Time) {
		t.Fatalf("facts of a Held grant = %+v", f)
	}
	// A release asked for ends the grant for every enforcement point at
	// once, before the controller has answered; a waiting request that is
	// withdrawn too.
	for _, phase := range []lockingv1alpha1.LockGrantPhase{lockingv1alpha1.PhaseHeld, lockingv1alpha1.PhasePending, ""} {
		g := held.DeepCopy()
		g.Status.Phase, g.Spec.Release = phase, true
		if s := k8s.Grant(g).State; s != fencing.StateReleased {
			t.Errorf("phase %q with release asked for: state %v, want Released", phase, s)
		}
	}
	g := held.DeepCopy()
	g.Status.Phase, g.Spec.Release = lockingv1alpha1.PhaseExpired, true
	if s := k8s.Grant(g).State; s != fencing.StateExpired {
		t.Errorf("an expired grant whose owner then released: state %v, want Expired", s)
	}
	if k8s.Grant(nil) != nil || k8s.Counter(nil) != nil {
		t.Error("facts of nil objects are not nil")
	}
	c := k8s.Counter(&lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Fence: 9,
		Holder: &lockingv1alpha1.FenceHolder{UID: "u1", Fence: 9}}})
	if c.Fence != 9 || c.HolderUID != "u1" {
		t.Fatalf("facts of a counter = %+v", c)
	}
}
