package main

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A waiting user is told when only an operator can get the request
// granted, with the code and the controller's message; not for an
// ordinary wait.
func TestHeldBackLine(t *testing.T) {
	waiting := func(reason, msg string) *lockingv1alpha1.LockGrant {
		g := &lockingv1alpha1.LockGrant{}
		g.Status.Conditions = []metav1.Condition{{Type: lockingv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg}}
		return g
	}
	for _, tc := range []struct {
		g    *lockingv1alpha1.LockGrant
		want string
	}{
		{waiting(lockingv1alpha1.LockGrantReasonSequenceExhausted, "raise the FenceIssuer's spec.epoch to 4 or more"), "SEQUENCE_EXHAUSTED: raise the FenceIssuer's spec.epoch to 4 or more"},
		{waiting(lockingv1alpha1.LockGrantReasonEpochBehind, "raise it to 9"), "EPOCH_BEHIND: raise it to 9"},
		{waiting("Pending", "Waiting in the queue for the resource"), ""},
		{waiting(lockingv1alpha1.LockGrantReasonLockDelay, "Next in line"), ""},
		{&lockingv1alpha1.LockGrant{}, ""},
	} {
		if got := heldBack(tc.g); got != tc.want {
			t.Errorf("heldBack() = %q, want %q", got, tc.want)
		}
	}
}
