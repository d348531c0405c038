package lock

import (
	"errors"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A holder that ends RELEASED or TIMED_OUT reports that code itself, which
// matches its own sentinel and fencing.ErrAlreadyEnded; every other final
// reason is reported as it is, an unknown one as UNKNOWN_GRANT.
func TestLostKeepsTheReason(t *testing.T) {
	for _, tc := range []struct {
		reason, want fencing.Reason
		sentinels    []error
	}{
		{fencing.ReasonReleased, fencing.ReasonReleased, []error{fencing.ErrGrantReleased, fencing.ErrAlreadyEnded}},
		{fencing.ReasonTimedOut, fencing.ReasonTimedOut, []error{fencing.ErrTimedOut, fencing.ErrAlreadyEnded}},
		{fencing.ReasonRevoked, fencing.ReasonRevoked, []error{fencing.ErrRevoked}},
		{fencing.ReasonExpired, fencing.ReasonExpired, []error{fencing.ErrExpired}},
		{"SOMETHING_NEW", fencing.ReasonUnknownGrant, []error{fencing.ErrUnknownGrant}},
	} {
		err := lost(tc.reason)
		if !errors.Is(err, ErrLost) || fencing.ReasonOf(err) != tc.want {
			t.Errorf("lost(%s) = %v, want ErrLost and %s", tc.reason, err, tc.want)
		}
		for _, s := range tc.sentinels {
			if !errors.Is(err, s) {
				t.Errorf("lost(%s) = %v does not match %v", tc.reason, err, s)
			}
		}
	}
}
