package facts_test

import (
	"strings"
	"testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// The API's reasons that stand for a refusal are their code's
// ConditionReason, and the metric label is the code again; every reason
// is CamelCase.
func TestAPIReasonsAreTheCodesInCamelCase(t *testing.T) {
	for reason, code := range map[string]fencing.Reason{
		lockingv1alpha1.LockGrantReasonExpired:           fencing.ReasonExpired,
		lockingv1alpha1.LockGrantReasonAlreadyEnded:      fencing.ReasonAlreadyEnded,
		lockingv1alpha1.LockGrantReasonTimedOut:          fencing.ReasonTimedOut,
		lockingv1alpha1.LockGrantReasonReleased:          fencing.ReasonReleased,
		lockingv1alpha1.LockGrantReasonRevokedEpoch:      fencing.ReasonRevokedEpoch,
		lockingv1alpha1.LockGrantReasonFenceRegression:   fencing.ReasonFenceRegression,
		lockingv1alpha1.LockGrantReasonSessionExpired:    fencing.ReasonSessionExpired,
		lockingv1alpha1.LockGrantReasonSequenceExhausted: fencing.ReasonSequenceExhausted,
		lockingv1alpha1.LockGrantReasonEpochBehind:       fencing.ReasonEpochBehind,
		lockingv1alpha1.GuardPolicyReasonInvalidPolicy:   fencing.ReasonInvalidPolicy,
	} {
		if want := code.ConditionReason(); reason != want {
			t.Errorf("reason of %s = %q, want %q", code, reason, want)
		}
		if got := fencing.CodeOf(reason); got != string(code) {
			t.Errorf("metric label of %q = %q, want %s", reason, got, code)
		}
	}
	for _, r := range []string{
		lockingv1alpha1.LockGrantReasonPending, lockingv1alpha1.LockGrantReasonLockDelay,
		lockingv1alpha1.LockGrantReasonGranted, lockingv1alpha1.LockGrantReasonRenewed,
		lockingv1alpha1.LockGrantReasonCancelled, lockingv1alpha1.LockGrantReasonSuperseded,
		lockingv1alpha1.LockGrantReasonPolicyDenied, lockingv1alpha1.LockGrantReasonOverLimit,
		lockingv1alpha1.LockGrantReasonWithinLimit, lockingv1alpha1.FenceIssuerReasonPublished,
		lockingv1alpha1.GuardPolicyReasonWebhookInstalled, lockingv1alpha1.GuardPolicyReasonShadowDenied,
		lockingv1alpha1.GatedPodReasonWaiting, lockingv1alpha1.GatedPodReasonGranted,
		lockingv1alpha1.GatedPodReasonLockLost, lockingv1alpha1.GatedPodReasonRequestEnded,
		lockingv1alpha1.GatedPodReasonGateRemoved, lockingv1alpha1.GatedPodReasonInvalidRequest,
		lockingv1alpha1.GatedPodReasonRequestRefused, lockingv1alpha1.GatedPodReasonNodeLost,
		lockingv1alpha1.GatedPodReasonNotReady, lockingv1alpha1.EventReasonGuardOverridden,
		lockingv1alpha1.EventReasonCertificateSecretCreated,
	} {
		if r == "" || r[0] < 'A' || r[0] > 'Z' || strings.ContainsAny(r, "_ ") {
			t.Errorf("reason %q is not CamelCase", r)
		}
	}
}
