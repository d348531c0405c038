package grantplan

import (
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Condition and Event reasons are CamelCase; those that stand for a
// refusal are their code's ConditionReason, and the metric label is the
// code again.
func TestReasonsAreTheCodesInCamelCase(t *testing.T) {
	for reason, code := range map[string]fencing.Reason{
		ReasonExpired:           fencing.ReasonExpired,
		ReasonAlreadyEnded:      fencing.ReasonAlreadyEnded,
		ReasonRevokedEpoch:      fencing.ReasonRevokedEpoch,
		ReasonFenceRegression:   fencing.ReasonFenceRegression,
		ReasonSessionExpired:    fencing.ReasonSessionExpired,
		ReasonSequenceExhausted: fencing.ReasonSequenceExhausted,
		ReasonEpochBehind:       fencing.ReasonEpochBehind,
	} {
		if want := code.ConditionReason(); reason != want {
			t.Errorf("reason of %s = %q, want %q", code, reason, want)
		}
		if got := fencing.CodeOf(reason); got != string(code) {
			t.Errorf("metric label of %q = %q, want %s", reason, got, code)
		}
	}
	for _, r := range []string{ReasonPending, ReasonGranted, ReasonRenewed, ReasonReleased, ReasonCancelled,
		ReasonExpired, ReasonAlreadyEnded, ReasonTimedOut, ReasonSuperseded, ReasonRevokedEpoch,
		ReasonPolicyDenied, ReasonFenceRegression, ReasonSessionExpired, ReasonSequenceExhausted, ReasonEpochBehind} {
		if r == "" || r[0] < 'A' || r[0] > 'Z' || strings.ContainsAny(r, "_ ") {
			t.Errorf("reason %q is not CamelCase", r)
		}
	}
}
