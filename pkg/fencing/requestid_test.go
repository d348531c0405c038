package fencing_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckRequestID(t *testing.T) {
	ended := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	spent := func(s fencing.State) *fencing.SpentRequest {
		return &fencing.SpentRequest{RequestID: "nightly-2026-12-03", State: s, EndedAt: ended, SpentUntil: ended.Add(7 * 24 * time.Hour)}
	}
	for _, tc := range []struct {
		name   string
		spent  *fencing.SpentRequest
		now    time.Time
		want   fencing.Reason
		notice bool
	}{
		{"never spent", nil, ended, "", false},
		{"released, within the window", spent(fencing.StateReleased), ended.Add(time.Hour), fencing.ReasonAlreadyEnded, false},
		{"timed out in the queue", spent(fencing.StateTimedOut), ended.Add(time.Hour), fencing.ReasonAlreadyEnded, false},
		{"expired", spent(fencing.StateExpired), ended.Add(time.Hour), fencing.ReasonExpired, false},
		{"revoked", spent(fencing.StateRevoked), ended, fencing.ReasonRevoked, false},
		{"the last instant of the window", spent(fencing.StateReleased), ended.Add(7*24*time.Hour - time.Nanosecond), fencing.ReasonAlreadyEnded, false},
		{"the window's end: a new attempt, told so", spent(fencing.StateReleased), ended.Add(7 * 24 * time.Hour), "", true},
		{"long after", spent(fencing.StateExpired), ended.Add(10 * 24 * time.Hour), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notice, err := fencing.CheckRequestID(tc.spent, tc.now)
			if fencing.ReasonOf(err) != tc.want || (tc.want != "" && !errors.Is(err, tc.want.Sentinel())) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if tc.want != "" && (!strings.Contains(err.Error(), "is spent") || !strings.Contains(err.Error(), "2026-12-10T00:00:00Z")) {
				t.Fatalf("refusal %q does not say the ID is spent until when", err)
			}
			if (notice != "") != tc.notice || (tc.notice && !strings.Contains(notice, "new attempt")) {
				t.Fatalf("notice %q, want one: %v", notice, tc.notice)
			}
		})
	}
}
