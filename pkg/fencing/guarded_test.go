package fencing_test

import (
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckGuardedRequest(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	// A2 (identity "A", a replica sharing the identity of A1) holds fence 2
	// and wrote the object last; A1's grant had fence 1.
	a2 := func() *fencing.Grant {
		return &fencing.Grant{UID: "uid-a2", Resource: res, Owner: "A", State: fencing.StateHeld, Fence: 2, ExpiresAt: at(20)}
	}
	a1 := func() *fencing.Grant {
		return &fencing.Grant{UID: "uid-a1", Resource: res, Owner: "A", State: fencing.StateExpired, Fence: 1, ExpiresAt: at(10)}
	}
	counter := &fencing.Counter{Fence: 2, HolderUID: "uid-a2"}
	claimA2 := fencing.Claim{Grant: "a2", Fence: "2"}
	claimA1 := fencing.Claim{Grant: "a1", Fence: "1"}
	recA2 := fencing.Accepted{Grant: "billing/a2", Fence: 2}
	update := func(claim fencing.Claim, g *fencing.Grant) fencing.GuardedRequest {
		return fencing.GuardedRequest{
			Operation: fencing.OpUpdate, Resource: res, ObjectNamespace: "billing", Caller: "A", Claim: claim,
			StoredGuarded: true, Record: recA2, StoredVersion: "41", Grant: g, Counter: counter, Now: at(15),
		}
	}
	del := func(precondition string, rec fencing.Accepted) fencing.GuardedRequest {
		r := update(fencing.Claim{}, a2())
		r.Operation, r.Precondition, r.Record = fencing.OpDelete, precondition, rec
		return r
	}
	with := func(r fencing.GuardedRequest, f func(*fencing.GuardedRequest)) fencing.GuardedRequest {
		f(&r)
		return r
	}

	tests := []struct {
		name string
		r    fencing.GuardedRequest
		want fencing.Reason // "" means accepted
	}{
		{"current holder asserts", update(claimA2, a2()), ""},
		{"the holder's fence in the issuer's current epoch", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) {
			r.Bundle = &fencing.TrustBundle{CurrentEpoch: 0}
		}), ""},
		{"a fence of a revoked issuer epoch, before the controller revoked its grant", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) {
			r.Bundle = &fencing.TrustBundle{CurrentEpoch: 1, RevokedEpochs: []int64{0}}
		}), fencing.ReasonRevokedEpoch},
		{"a fence of an issuer epoch the issuer moved past", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) {
			r.Bundle = &fencing.TrustBundle{CurrentEpoch: 1}
		}), fencing.ReasonRevokedEpoch},
		{"a patch that asserts nothing, even by the holder's identity", update(fencing.Claim{}, a2()), fencing.ReasonNoFence},
		{"an inherited claim is not an assertion", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) { r.StoredClaim = claimA2 }), fencing.ReasonNoFence},
		{"a fresh write ID tells the holder's claim from a squatted copy", with(update(fencing.Claim{Grant: "a2", Fence: "2", WriteID: "7f3a"}, a2()), func(r *fencing.GuardedRequest) {
			r.StoredGuarded, r.StoredClaim = false, claimA2
		}), ""},
		{"stale replica asserts its own fence", update(claimA1, a1()), fencing.ReasonStaleOwner},
		{"stale replica with its old fence under the successor's grant", update(fencing.Claim{Grant: "a2", Fence: "1"}, a2()), fencing.ReasonStaleOwner},
		{"another identity under the holder's grant", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) { r.Caller = "C" }), fencing.ReasonNotOwner},
		{"malformed fence", update(fencing.Claim{Grant: "a2", Fence: "02"}, a2()), fencing.ReasonNoFence},
		{"grant of another namespace", update(fencing.Claim{Grant: "other/a2", Fence: "2"}, a2()), fencing.ReasonBindingMismatch},
		{"unknown intent", update(fencing.Claim{Grant: "a2", Fence: "2", Intent: "drop"}, a2()), fencing.ReasonNoFence},
		{"a record on an unguarded object is nobody's", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) {
			r.StoredGuarded, r.Record = false, fencing.Accepted{Grant: "billing/x", Fence: 1 << 62}
		}), ""},
		{"the guard's own record still refuses an older fence", with(update(claimA1, a1()), func(r *fencing.GuardedRequest) {
			r.Record = fencing.Accepted{Grant: "billing/x", Fence: 3}
		}), fencing.ReasonStaleOwner},
		{"a record above every fence the registry issued: the registry lost fences", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) {
			r.Record = fencing.Accepted{Grant: "billing/x", Fence: 3}
		}), fencing.ReasonFenceRegression},
		{"a record naming a grant of another namespace is nobody's", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) {
			r.Record = fencing.Accepted{Grant: "other/x", Fence: 1 << 40}
		}), ""},
		{"a delete under a record of another namespace", del("41", fencing.Accepted{Grant: "other/a2", Fence: 2, Intent: "delete"}), fencing.ReasonNoFence},
		{"proof required under a policy", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) { r.RequireProof, r.Policy = true, "p" }), fencing.ReasonNoFence},
		{"scale cannot carry a claim", with(update(claimA2, a2()), func(r *fencing.GuardedRequest) { r.Opaque, r.Subresource = true, "scale" }), fencing.ReasonNoFence},
		{"eviction cannot carry a claim", with(del("41", fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: "delete"}), func(r *fencing.GuardedRequest) {
			r.Opaque, r.Subresource = true, "eviction"
		}), fencing.ReasonNoFence},
		{"delete after a pre-delete write, with its version", del("41", fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: "delete"}), ""},
		{"delete without a precondition", del("", fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: "delete"}), fencing.ReasonNoFence},
		{"delete with a stale precondition", del("40", fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: "delete"}), fencing.ReasonNoFence},
		{"delete when the last write was not a pre-delete write", del("41", recA2), fencing.ReasonNoFence},
		{"delete by another identity", with(del("41", fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: "delete"}), func(r *fencing.GuardedRequest) { r.Caller = "C" }), fencing.ReasonNotOwner},
		{"delete after the grant expired", with(del("41", fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: "delete"}), func(r *fencing.GuardedRequest) { r.Now = at(20) }), fencing.ReasonExpired},
		{"delete while the namespace terminates", with(del("", fencing.Accepted{}), func(r *fencing.GuardedRequest) { r.NamespaceTerminating = true }), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := fencing.CheckGuardedRequest(tc.r)
			if got := fencing.ReasonOf(err); got != tc.want {
				t.Fatalf("CheckGuardedRequest() = %v, want reason %q", err, tc.want)
			}
			if tc.want == "" && tc.r.Operation != fencing.OpDelete && rec.Fence == 0 {
				t.Fatalf("accepted a write without a record to write")
			}
			if tc.want != "" && rec != (fencing.Accepted{}) {
				t.Fatalf("a refusal returned a record %+v", rec)
			}
		})
	}
}

func TestGuardedRequestTarget(t *testing.T) {
	r := fencing.GuardedRequest{Operation: fencing.OpUpdate, ObjectNamespace: "billing", Claim: fencing.Claim{Grant: "g", Fence: "3"}}
	if ns, n, ok := r.Target(); !ok || ns != "billing" || n != "g" {
		t.Fatalf("Target() = %q %q %v", ns, n, ok)
	}
	d := fencing.GuardedRequest{Operation: fencing.OpDelete, ObjectNamespace: "billing", StoredGuarded: true, Record: fencing.AcceptedOf("billing/g", "3", "delete", "", "")}
	if ns, n, ok := d.Target(); !ok || ns != "billing" || n != "g" {
		t.Fatalf("delete Target() = %q %q %v", ns, n, ok)
	}
	if _, _, ok := (fencing.GuardedRequest{Operation: fencing.OpDelete, Record: d.Record}).Target(); ok {
		t.Fatal("a record on an unguarded object named a grant to read")
	}
	other := d
	other.ObjectNamespace = "payroll"
	if _, _, ok := other.Target(); ok {
		t.Fatal("a record naming a grant of another namespace named a grant to read")
	}
}
