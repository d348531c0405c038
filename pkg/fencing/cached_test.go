package fencing_test

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A cache behind the registry may answer only an acceptance, and only on a
// counter that names the claimed grant, with its fence, before the lease
// end it recorded; everything else is left to a linearizable read.
func TestAcceptFromCache(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	holder := func() *fencing.Grant {
		return &fencing.Grant{UID: "uid-a2", Resource: res, Owner: "A", State: fencing.StateHeld, Fence: 2, ExpiresAt: at(20)}
	}
	update := func() fencing.GuardedRequest {
		return fencing.GuardedRequest{
			Operation: fencing.OpUpdate, Resource: res, ObjectNamespace: "billing", Caller: "A",
			Claim: fencing.Claim{Grant: "a2", Fence: "2"}, StoredGuarded: true, Record: fencing.Accepted{Grant: "billing/a1", Fence: 1},
			StoredVersion: "41", Grant: holder(), Counter: &fencing.Counter{Fence: 2, HolderUID: "uid-a2"}, Now: at(15),
		}
	}
	with := func(f func(*fencing.GuardedRequest)) fencing.GuardedRequest {
		r := update()
		f(&r)
		return r
	}
	tests := []struct {
		name string
		r    fencing.GuardedRequest
		want bool
	}{
		{"the counter names the claimed grant with its fence and a live lease", update(), true},
		{"the lease end the cache recorded has passed by the enforcement point's clock", with(func(r *fencing.GuardedRequest) { r.Now = at(20) }), false},
		{"no lease end recorded", with(func(r *fencing.GuardedRequest) { r.Grant.ExpiresAt = time.Time{} }), false},
		{"the counter names another grant", with(func(r *fencing.GuardedRequest) { r.Counter.HolderUID = "uid-b" }), false},
		{"the counter issued a newer fence", with(func(r *fencing.GuardedRequest) { r.Counter.Fence = 3 }), false},
		{"the grant is not Held", with(func(r *fencing.GuardedRequest) { r.Grant.State = fencing.StateReleased }), false},
		{"no grant read", with(func(r *fencing.GuardedRequest) { r.Grant = nil }), false},
		{"no counter read", with(func(r *fencing.GuardedRequest) { r.Counter = nil }), false},
		{"the claim's fence is not the grant's", with(func(r *fencing.GuardedRequest) { r.Claim.Fence = "1" }), false},
		{"the object recorded a higher fence: refused, so no answer", with(func(r *fencing.GuardedRequest) {
			r.Record = fencing.Accepted{Grant: "billing/b", Fence: 3}
		}), false},
		{"another identity: refused, so no answer", with(func(r *fencing.GuardedRequest) { r.Caller = "B" }), false},
		{"an administrator's override is judged on the registry", with(func(r *fencing.GuardedRequest) {
			r.Override = &fencing.Override{Reason: "wedged", Authorized: true}
		}), false},
		// Nothing on the object orders the write after a successor's: a
		// successor may have deleted the object (its record went with
		// it), and the old holder's create from a cache behind would be
		// accepted after the successor's last write.
		{"a create: no record to order it against a successor's writes", with(func(r *fencing.GuardedRequest) {
			r.Operation, r.StoredClaim, r.StoredGuarded, r.Record, r.StoredVersion = fencing.OpCreate, fencing.Claim{}, false, fencing.Accepted{}, ""
		}), false},
		{"an object that was not guarded: its record is nobody's", with(func(r *fencing.GuardedRequest) { r.StoredGuarded = false }), false},
		{"an object with no record", with(func(r *fencing.GuardedRequest) { r.Record = fencing.Accepted{} }), false},
		{"a record of another namespace counts for nothing", with(func(r *fencing.GuardedRequest) {
			r.Record = fencing.Accepted{Grant: "payments/a1", Fence: 1}
		}), false},
		{"a delete under the pre-delete write of the holder", with(func(r *fencing.GuardedRequest) {
			r.Operation, r.Claim, r.Precondition = fencing.OpDelete, fencing.Claim{}, "41"
			r.Record = fencing.Accepted{Grant: "billing/a2", Fence: 2, Intent: fencing.IntentDelete}
		}), true},
		{"a delete under an older holder's pre-delete write", with(func(r *fencing.GuardedRequest) {
			r.Operation, r.Claim, r.Precondition = fencing.OpDelete, fencing.Claim{}, "41"
			r.Record = fencing.Accepted{Grant: "billing/a2", Fence: 1, Intent: fencing.IntentDelete}
		}), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec, ok := fencing.AcceptFromCache(tc.r)
			if ok != tc.want {
				t.Fatalf("AcceptFromCache = %v, want %v", ok, tc.want)
			}
			if ok {
				if _, err := fencing.CheckGuardedRequest(tc.r); err != nil {
					t.Fatalf("accepted from the cache what CheckGuardedRequest refuses: %v", err)
				}
				if tc.r.Operation != fencing.OpDelete && rec.Fence != 2 {
					t.Fatalf("record %+v", rec)
				}
			}
		})
	}
}
