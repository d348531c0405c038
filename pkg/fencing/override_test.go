package fencing_test

import (
	"math"
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A fence rounded by a JSON tool (jq reads numbers as float64, exact only
// up to 2^53) is refused as a fence that was never issued, not as one of a
// revoked epoch: rounded down, its epoch bits fall into the epoch before.
func TestRoundedFenceIsNotIssued(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	issued := fenceOf(fencing.MaxEpoch, 1) // 9223370937343148033
	for name, text := range map[string]string{
		"jq 1.6 (17 significant digits)":    "9223370937343148000", // epoch MaxEpoch-1, sequence 2^40-32
		"jq 1.7 (the double, exactly)":      "9223370937343148032", // sequence 0
		"an epoch above 2^13, rounded down": "10995116277760000",   // 10000<<40, sequence 0
	} {
		t.Run(name, func(t *testing.T) {
			grantFence := issued
			if name == "an epoch above 2^13, rounded down" {
				grantFence = fenceOf(10000, 1)
			}
			g := &fencing.Grant{UID: "uid-a", Resource: res, Owner: "A", State: fencing.StateHeld, Fence: grantFence, ExpiresAt: at(20)}
			r := fencing.GuardedRequest{
				Operation: fencing.OpUpdate, Resource: res, ObjectNamespace: "billing", Caller: "A",
				Claim: fencing.Claim{Grant: "a", Fence: text}, StoredGuarded: true, Grant: g,
				Counter: &fencing.Counter{Fence: grantFence, HolderUID: "uid-a"}, Now: at(5),
				Bundle: &fencing.TrustBundle{CurrentEpoch: fencing.EpochOf(grantFence), RevokedEpochs: []int64{fencing.EpochOf(grantFence) - 1}},
			}
			_, err := fencing.CheckGuardedRequest(r)
			if fencing.ReasonOf(err) != fencing.ReasonFenceNotIssued {
				t.Fatalf("CheckGuardedRequest() = %v, want FENCE_NOT_ISSUED", err)
			}
			r.Claim.Fence = fencing.FormatFence(grantFence)
			if _, err := fencing.CheckGuardedRequest(r); err != nil {
				t.Fatalf("the grant's own fence as text: %v", err)
			}
		})
	}
}

// After a reinstall the registry issues fences below what an object
// accepted: the refusal the new holder gets says so, and which epoch to
// set.
func TestRegistryBehindTheObject(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	for _, tc := range []struct {
		name     string
		recorded int64
		want     string
	}{
		{"an object of epoch 7, the issuer at 6", fenceOf(7, 1), "spec.epoch to 8 or more"},
		{"an object of the last epoch", fenceOf(fencing.MaxEpoch, 1), "An object wedged in the last epoch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fence := fenceOf(6, 1)
			g := &fencing.Grant{UID: "uid-n", Resource: res, Owner: "N", State: fencing.StateHeld, Fence: fence, ExpiresAt: at(20)}
			_, err := fencing.CheckGuardedRequest(fencing.GuardedRequest{
				Operation: fencing.OpUpdate, Resource: res, ObjectNamespace: "billing", Caller: "N",
				Claim: fencing.Claim{Grant: "n", Fence: fencing.FormatFence(fence)}, StoredGuarded: true,
				Record: fencing.Accepted{Grant: "billing/old", Fence: tc.recorded}, Grant: g,
				Counter: &fencing.Counter{Fence: fence, HolderUID: "uid-n"}, Now: at(5), Bundle: &fencing.TrustBundle{CurrentEpoch: 6},
			})
			if fencing.ReasonOf(err) != fencing.ReasonFenceRegression || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckGuardedRequest() = %v, want FENCE_REGRESSION saying %q", err, tc.want)
			}
		})
	}
}

func TestWedged(t *testing.T) {
	last := fenceOf(fencing.MaxEpoch, 5)
	for _, tc := range []struct {
		name     string
		recorded int64
		c        *fencing.Counter
		want     bool
	}{
		{"a fence of the last epoch the registry never issued", last, &fencing.Counter{Fence: fenceOf(6, 1)}, true},
		{"no fence record at all", last, nil, true},
		{"the registry's sequence in the last epoch passed it", last, &fencing.Counter{Fence: last + 1}, false},
		{"the registry's holder has that very fence", last, &fencing.Counter{Fence: last, HolderUID: "u"}, false},
		{"the last fence there is, its holder gone", math.MaxInt64, &fencing.Counter{Fence: math.MaxInt64}, true},
		{"the last fence there is, still held", math.MaxInt64, &fencing.Counter{Fence: math.MaxInt64, HolderUID: "u"}, false},
		{"a fence of an earlier epoch: raise the issuer instead", fenceOf(7, 1), &fencing.Counter{Fence: fenceOf(6, 1)}, false},
		{"no fence", 0, nil, false},
	} {
		if got := fencing.Wedged(tc.recorded, tc.c); got != tc.want {
			t.Errorf("%s: Wedged() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An administrator's override applies to a wedged object only, names its
// reason, and admits the administrator's delete after it; nobody else's.
func TestOverride(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	wedged := fencing.Accepted{Grant: "billing/old", Fence: fenceOf(fencing.MaxEpoch, 1)}
	admin := &fencing.Override{Reason: "reinstall left a fence of the last epoch; ticket 42", Authorized: true}
	update := func(rec fencing.Accepted, o *fencing.Override) fencing.GuardedRequest {
		return fencing.GuardedRequest{
			Operation: fencing.OpUpdate, Resource: res, ObjectNamespace: "billing", Caller: "admin", Unguards: true,
			StoredGuarded: true, Record: rec, StoredVersion: "41", Override: o,
			Counter: &fencing.Counter{Fence: fenceOf(6, 3)}, Now: at(5), Bundle: &fencing.TrustBundle{CurrentEpoch: 6},
		}
	}
	del := func(rec fencing.Accepted, o *fencing.Override, precondition string) fencing.GuardedRequest {
		r := update(rec, o)
		r.Operation, r.Precondition, r.Unguards = fencing.OpDelete, precondition, false
		return r
	}
	overridden := wedged
	overridden.Intent = fencing.IntentOverride
	tests := []struct {
		name string
		r    fencing.GuardedRequest
		want fencing.Reason
	}{
		{"an administrator unguards a wedged object", update(wedged, admin), ""},
		{"without the verb", update(wedged, &fencing.Override{Reason: "x"}), fencing.ReasonNotOwner},
		{"without a reason", update(wedged, &fencing.Override{Reason: " ", Authorized: true}), fencing.ReasonOverrideRefused},
		{"an object whose epoch can still be passed", update(fencing.Accepted{Grant: "billing/old", Fence: fenceOf(7, 1)}, admin), fencing.ReasonOverrideRefused},
		{"an object with no record", update(fencing.Accepted{}, admin), fencing.ReasonOverrideRefused},
		{"the administrator's delete after the override", del(overridden, &fencing.Override{Authorized: true}, "41"), ""},
		{"anyone else's delete after it", del(overridden, nil, "41"), fencing.ReasonNotOwner},
		{"a delete after it without its version", del(overridden, &fencing.Override{Authorized: true}, "40"), fencing.ReasonNoFence},
		{"an administrator's delete without an override", del(wedged, &fencing.Override{Authorized: true}, "41"), fencing.ReasonNoFence},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := fencing.CheckGuardedRequest(tc.r)
			if got := fencing.ReasonOf(err); got != tc.want {
				t.Fatalf("CheckGuardedRequest() = %v, want reason %q", err, tc.want)
			}
			if tc.want == "" && tc.r.Operation == fencing.OpUpdate &&
				(rec.Fence != wedged.Fence || rec.Intent != fencing.IntentOverride || rec.Grant != wedged.Grant) {
				t.Fatalf("the override records %+v; want the stored fence kept, with intent %q", rec, fencing.IntentOverride)
			}
		})
	}
}
