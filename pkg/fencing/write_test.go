package fencing_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

var t0 = time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// heldA is A's grant: fence 1, Held until t=10.
func heldA() *fencing.Grant {
	return &fencing.Grant{UID: "uid-a", Resource: "invoice-batch/2026-07-19", Owner: "A", State: fencing.StateHeld, Fence: 1, ExpiresAt: at(10)}
}

func TestCheckWrite(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	holderA := &fencing.Counter{Fence: 1, HolderUID: "uid-a"}
	tests := []struct {
		name string
		w    fencing.Write
		want fencing.Reason // "" means accepted
	}{
		{"holder writes", fencing.Write{Resource: res, Caller: "A", Fence: 1, Grant: heldA(), Counter: holderA, Now: at(5)}, ""},
		{"holder writes again at the recorded fence", fencing.Write{Resource: res, Caller: "A", Fence: 1, Recorded: 1, Grant: heldA(), Counter: holderA, Now: at(9.999)}, ""},
		{"unknown grant", fencing.Write{Resource: res, Caller: "A", Fence: 1, Counter: holderA, Now: at(5)}, fencing.ReasonUnknownGrant},
		{"no fence record", fencing.Write{Resource: res, Caller: "A", Fence: 1, Grant: heldA(), Now: at(5)}, fencing.ReasonUnknownGrant},
		{"grant for another resource", fencing.Write{Resource: "other", Caller: "A", Fence: 1, Grant: heldA(), Counter: holderA, Now: at(5)}, fencing.ReasonBindingMismatch},
		{"forged huge fence", fencing.Write{Resource: res, Caller: "A", Fence: 1 << 62, Grant: heldA(), Counter: holderA, Now: at(5)}, fencing.ReasonBindingMismatch},
		{"another identity", fencing.Write{Resource: res, Caller: "B", Fence: 1, Grant: heldA(), Counter: holderA, Now: at(5)}, fencing.ReasonNotOwner},
		{"object accepted a newer fence", fencing.Write{Resource: res, Caller: "A", Fence: 1, Recorded: 2, Grant: heldA(), Counter: &fencing.Counter{Fence: 2, HolderUID: "uid-b"}, Now: at(5)}, fencing.ReasonStaleOwner},
		// The registry lost fences (CRDs reinstalled, an old snapshot
		// restored): it names A with its newest fence, 1, as the holder,
		// but the object accepted 2. A is not stale; the registry is behind.
		{"object accepted a fence above the registry's newest", fencing.Write{Resource: res, Caller: "A", Fence: 1, Recorded: 2, Grant: heldA(), Counter: holderA, Now: at(5)}, fencing.ReasonFenceRegression},
		{"a fence rounded by a JSON tool", fencing.Write{Resource: res, Caller: "A", Fence: 9223370937343148000, Grant: &fencing.Grant{UID: "uid-a", Resource: res, Owner: "A", State: fencing.StateHeld, Fence: 9223370937343148033, ExpiresAt: at(10)}, Counter: &fencing.Counter{Fence: 9223370937343148033, HolderUID: "uid-a"}, Now: at(5)}, fencing.ReasonFenceNotIssued},
		{"expiry is at expiresAt, equality included", fencing.Write{Resource: res, Caller: "A", Fence: 1, Grant: heldA(), Counter: holderA, Now: at(10)}, fencing.ReasonExpired},
		{
			// A holder paused past its lease: B was granted fence 2 but has not written yet.
			"superseded before the successor wrote",
			fencing.Write{Resource: res, Caller: "A", Fence: 1, Recorded: 1, Grant: func() *fencing.Grant { g := heldA(); g.State = fencing.StateExpired; return g }(), Counter: &fencing.Counter{Fence: 2, HolderUID: "uid-b"}, Now: at(12.5)},
			fencing.ReasonStaleOwner,
		},
		{
			// The same owner re-acquired: a goroutine of the first term writes fence 5 under the second grant.
			"old fence under a newer grant of the same owner",
			fencing.Write{Resource: res, Caller: "A", Fence: 5, Grant: &fencing.Grant{UID: "uid-a2", Resource: res, Owner: "A", State: fencing.StateHeld, Fence: 6, ExpiresAt: at(20)}, Counter: &fencing.Counter{Fence: 6, HolderUID: "uid-a2"}, Now: at(5)},
			fencing.ReasonStaleOwner,
		},
		{"released grant", fencing.Write{Resource: res, Caller: "A", Fence: 1, Grant: func() *fencing.Grant { g := heldA(); g.State = fencing.StateReleased; return g }(), Counter: &fencing.Counter{Fence: 1}, Now: at(5)}, fencing.ReasonAlreadyEnded},
		{"no fence", fencing.Write{Resource: res, Caller: "A", Fence: 0, Grant: heldA(), Counter: holderA, Now: at(5)}, fencing.ReasonNoFence},
		{"pending grant has no fence to present", fencing.Write{Resource: res, Caller: "A", Fence: 1, Grant: &fencing.Grant{UID: "uid-a", Resource: res, Owner: "A"}, Counter: &fencing.Counter{Fence: 0}, Now: at(5)}, fencing.ReasonBindingMismatch},
		{"registry names another holder", fencing.Write{Resource: res, Caller: "A", Fence: 1, Grant: heldA(), Counter: &fencing.Counter{Fence: 1, HolderUID: "uid-x"}, Now: at(5)}, fencing.ReasonExpired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := fencing.CheckWrite(tc.w)
			if got := fencing.ReasonOf(err); got != tc.want {
				t.Fatalf("CheckWrite() = %v, want reason %q", err, tc.want)
			}
			if tc.want != "" && (err == nil || errors.Unwrap(err) == nil) {
				t.Fatalf("refusal %v does not unwrap to a sentinel", err)
			}
		})
	}
}

func TestParseFence(t *testing.T) {
	good := map[string]int64{"1": 1, "42": 42, "9223372036854775807": 1<<63 - 1}
	for s, want := range good {
		if got, err := fencing.ParseFence(s); err != nil || got != want {
			t.Errorf("ParseFence(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0", "-1", "+1", "01", " 1", "1 ", "1.0", "1e3", "0x10", "9223372036854775808", "abc", "١"} {
		if _, err := fencing.ParseFence(s); !errors.Is(err, fencing.ErrNoFence) {
			t.Errorf("ParseFence(%q) error = %v, want ErrNoFence", s, err)
		}
	}
}

func TestCheckRenewAndRelease(t *testing.T) {
	tests := []struct {
		name          string
		g             fencing.Grant
		caller        string
		now           time.Time
		renew, relase fencing.Reason
	}{
		{"owner, held", *heldA(), "A", at(4), "", ""},
		{"another identity", *heldA(), "B", at(4), fencing.ReasonNotOwner, fencing.ReasonNotOwner},
		{"at expiresAt", *heldA(), "A", at(10), fencing.ReasonExpired, fencing.ReasonExpired},
		{"expired phase", func() fencing.Grant { g := *heldA(); g.State = fencing.StateExpired; return g }(), "A", at(4), fencing.ReasonExpired, fencing.ReasonExpired},
		{"released", func() fencing.Grant { g := *heldA(); g.State = fencing.StateReleased; return g }(), "A", at(4), fencing.ReasonAlreadyEnded, fencing.ReasonAlreadyEnded},
		{"timed out", fencing.Grant{Owner: "A", State: fencing.StateTimedOut}, "A", at(4), fencing.ReasonAlreadyEnded, fencing.ReasonAlreadyEnded},
		{"pending: renew refused, withdraw allowed", fencing.Grant{Owner: "A", State: fencing.StatePending}, "A", at(4), fencing.ReasonNotHeld, ""},
		{"its steward", func() fencing.Grant { g := *heldA(); g.Steward = "M"; return g }(), "M", at(4), "", ""},
		{"its steward, after expiry", func() fencing.Grant { g := *heldA(); g.Steward = "M"; return g }(), "M", at(10), fencing.ReasonExpired, fencing.ReasonExpired},
		{"another grant's steward", *heldA(), "M", at(4), fencing.ReasonNotOwner, fencing.ReasonNotOwner},
		{"no steward is nobody's", *heldA(), "", at(4), fencing.ReasonNotOwner, fencing.ReasonNotOwner},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := fencing.ReasonOf(fencing.CheckRenew(tc.g, tc.caller, tc.now)); got != tc.renew {
				t.Errorf("CheckRenew reason = %q, want %q", got, tc.renew)
			}
			if got := fencing.ReasonOf(fencing.CheckRelease(tc.g, tc.caller, tc.now)); got != tc.relase {
				t.Errorf("CheckRelease reason = %q, want %q", got, tc.relase)
			}
		})
	}
}

// A fence record judges whether a grant still holds: a newer fence issued
// means it was superseded, another holder or none at its fence means its
// hold ended.
func TestCheckHolderOfRecord(t *testing.T) {
	for _, tc := range []struct {
		c    fencing.Counter
		want fencing.Reason
	}{
		{fencing.Counter{Fence: 7, HolderUID: "a"}, ""},
		{fencing.Counter{Fence: 8, HolderUID: "b"}, fencing.ReasonStaleOwner},
		{fencing.Counter{Fence: 8}, fencing.ReasonStaleOwner},
		{fencing.Counter{Fence: 7}, fencing.ReasonExpired},
	} {
		if got := fencing.ReasonOf(fencing.CheckHolderOfRecord(tc.c, "ledger/r", "a", 7)); got != tc.want {
			t.Errorf("CheckHolderOfRecord(%+v, a, 7) = %q, want %q", tc.c, got, tc.want)
		}
	}
}
