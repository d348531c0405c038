package fencing_test

import (
	"errors"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Every code a user can see is in the catalog: it parses, and its refusal
// matches its own sentinel and no other.
func TestEveryCodeHasItsSentinel(t *testing.T) {
	codes := []fencing.Reason{
		fencing.ReasonNoFence, fencing.ReasonNoResource, fencing.ReasonUnknownGrant, fencing.ReasonBindingMismatch,
		fencing.ReasonNotOwner, fencing.ReasonStaleOwner, fencing.ReasonExpired, fencing.ReasonNotHeld,
		fencing.ReasonAlreadyEnded, fencing.ReasonFenceRegression, fencing.ReasonRevoked, fencing.ReasonBadSignature,
		fencing.ReasonRevokedEpoch, fencing.ReasonInvalidSegment, fencing.ReasonSequenceGap,
		fencing.ReasonSegmentConflict, fencing.ReasonMutationUnknown, fencing.ReasonSessionExpired,
		fencing.ReasonTimedOut, fencing.ReasonReleased, fencing.ReasonDriverMismatch, fencing.ReasonInvalidSpec,
		fencing.ReasonInvalidPolicy, fencing.ReasonCounterProtected, fencing.ReasonInternal,
		fencing.ReasonFenceNotIssued, fencing.ReasonSequenceExhausted, fencing.ReasonEpochBehind, fencing.ReasonOverrideRefused,
		fencing.ReasonRequestIDLive,
	}
	seen := map[error]fencing.Reason{}
	for _, r := range codes {
		if got, ok := fencing.ParseReason(string(r)); !ok || got != r {
			t.Errorf("ParseReason(%q) = %q, %v", r, got, ok)
		}
		s := r.Sentinel()
		if s == nil {
			t.Errorf("%s has no sentinel", r)
			continue
		}
		if other, dup := seen[s]; dup {
			t.Errorf("%s and %s share a sentinel", r, other)
		}
		seen[s] = r
		if err := (&fencing.Error{Reason: r, Detail: "x"}); !errors.Is(err, s) || fencing.ReasonOf(err) != r {
			t.Errorf("a %s refusal does not match its sentinel", r)
		}
	}
	if _, ok := fencing.ParseReason("TIMEDOUT"); ok {
		t.Error("ParseReason accepted a code outside the catalog")
	}
}

func TestEndsGrant(t *testing.T) {
	tests := map[fencing.Reason]bool{
		fencing.ReasonExpired:          true,
		fencing.ReasonRevoked:          true,
		fencing.ReasonRevokedEpoch:     true,
		fencing.ReasonSessionExpired:   true,
		fencing.ReasonStaleOwner:       true,
		fencing.ReasonAlreadyEnded:     true,
		fencing.ReasonReleased:         true,
		fencing.ReasonTimedOut:         true,
		fencing.ReasonUnknownGrant:     true,
		fencing.ReasonNotOwner:         true,
		fencing.ReasonDriverMismatch:   true,
		"SOMETHING_NEW":                true, // unknown: fail closed
		fencing.ReasonNotHeld:          false,
		fencing.ReasonInternal:         false,
		fencing.ReasonInvalidSpec:      false,
		fencing.ReasonInvalidPolicy:    false,
		fencing.ReasonCounterProtected: false,
		fencing.ReasonRequestIDLive:    false,
	}
	for r, want := range tests {
		if got := fencing.EndsGrant(r); got != want {
			t.Errorf("EndsGrant(%s) = %v, want %v", r, got, want)
		}
	}
}

func TestConditionReason(t *testing.T) {
	for r, want := range map[fencing.Reason]string{
		fencing.ReasonExpired:           "Expired",
		fencing.ReasonRevokedEpoch:      "RevokedEpoch",
		fencing.ReasonFenceRegression:   "FenceRegression",
		fencing.ReasonSessionExpired:    "SessionExpired",
		fencing.ReasonAlreadyEnded:      "AlreadyEnded",
		fencing.ReasonNotHeld:           "NotHeld",
		fencing.ReasonSequenceExhausted: "SequenceExhausted",
		fencing.ReasonEpochBehind:       "EpochBehind",
		fencing.ReasonFenceNotIssued:    "FenceNotIssued",
	} {
		if got := r.ConditionReason(); got != want {
			t.Errorf("%s.ConditionReason() = %q, want %q", r, got, want)
		}
		if got := fencing.CodeOf(want); got != string(r) {
			t.Errorf("CodeOf(%q) = %q, want %s", want, got, r)
		}
	}
	for _, s := range []string{"Granted", "Renewed", "PolicyDenied", "Superseded", "Cancelled"} {
		if got := fencing.CodeOf(s); got != s {
			t.Errorf("CodeOf(%q) = %q, want it unchanged", s, got)
		}
	}
}

// RELEASED and TIMED_OUT say how a grant already ended: their refusals
// match ErrAlreadyEnded too, and no other code's does.
func TestEndedGrantsMatchAlreadyEnded(t *testing.T) {
	for r := range map[fencing.Reason]bool{fencing.ReasonReleased: true, fencing.ReasonTimedOut: true} {
		err := &fencing.Error{Reason: r, Detail: "x"}
		if !errors.Is(err, fencing.ErrAlreadyEnded) || !errors.Is(err, r.Sentinel()) || fencing.ReasonOf(err) != r {
			t.Errorf("a %s refusal: errors.Is ErrAlreadyEnded %v, its own sentinel %v", r, errors.Is(err, fencing.ErrAlreadyEnded), errors.Is(err, r.Sentinel()))
		}
	}
	for _, r := range []fencing.Reason{fencing.ReasonExpired, fencing.ReasonRevoked, fencing.ReasonNotHeld} {
		if errors.Is(&fencing.Error{Reason: r}, fencing.ErrAlreadyEnded) {
			t.Errorf("a %s refusal matches ErrAlreadyEnded", r)
		}
	}
	if errors.Is(&fencing.Error{Reason: fencing.ReasonAlreadyEnded}, fencing.ErrGrantReleased) {
		t.Error("an ALREADY_ENDED refusal matches ErrGrantReleased: it may have timed out")
	}
}
