package fencing_test

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckProvenWrite(t *testing.T) {
	key, other := testKey("one"), testKey("rogue")
	r := sampleRecord()
	b := bundle(trusted("k1", key, fencing.KeyActive))
	valid := func() fencing.ProvenWrite {
		return fencing.ProvenWrite{
			Proof: fencing.Sign(r, key), Bundle: b,
			GrantNamespace: r.Namespace, GrantName: r.Grant, OperationRoot: r.OperationRoot,
			Policy: r.Policy, PolicyGeneration: r.PolicyGeneration,
			Write: fencing.Write{
				Resource: r.Resource, Caller: r.Owner, Fence: r.Fence,
				Grant:   &fencing.Grant{UID: r.LeaseID, Resource: r.Resource, Owner: r.Owner, State: fencing.StateHeld, Fence: r.Fence, ExpiresAt: time.Unix(100, 0)},
				Counter: &fencing.Counter{Fence: r.Fence, HolderUID: r.LeaseID},
				Now:     time.Unix(50, 0),
			},
		}
	}
	forged := r
	forged.Fence = 1 << 62
	revoked := *b
	revoked.RevokedEpochs = []int64{0}
	tests := []struct {
		name   string
		mutate func(*fencing.ProvenWrite)
		want   fencing.Reason
	}{
		{"valid", func(*fencing.ProvenWrite) {}, ""},
		{"signed by a key the bundle does not trust", func(w *fencing.ProvenWrite) { w.Proof = fencing.Sign(r, other) }, fencing.ReasonBadSignature},
		{"forged huge fence in a re-signed record", func(w *fencing.ProvenWrite) { w.Proof = fencing.Sign(forged, other); w.Fence = forged.Fence }, fencing.ReasonBadSignature},
		{"replayed for another resource", func(w *fencing.ProvenWrite) { w.Resource = "invoice-batch/2026-07-20" }, fencing.ReasonBindingMismatch},
		{"replayed under another grant name", func(w *fencing.ProvenWrite) { w.GrantName = "someone-else" }, fencing.ReasonBindingMismatch},
		{"fence other than the record's", func(w *fencing.ProvenWrite) { w.Fence = r.Fence + 1 }, fencing.ReasonBindingMismatch},
		{"another operation", func(w *fencing.ProvenWrite) { w.OperationRoot = "sha256:00" }, fencing.ReasonBindingMismatch},
		{"object under another policy", func(w *fencing.ProvenWrite) { w.Policy = "other" }, fencing.ReasonBindingMismatch},
		{"record from a future policy generation", func(w *fencing.ProvenWrite) { w.PolicyGeneration = r.PolicyGeneration - 1 }, fencing.ReasonBindingMismatch},
		{"replayed by another identity", func(w *fencing.ProvenWrite) { w.Caller = "system:serviceaccount:billing:other" }, fencing.ReasonNotOwner},
		{"revoked epoch", func(w *fencing.ProvenWrite) { w.Bundle = &revoked }, fencing.ReasonRevokedEpoch},
		{"registry has another grant under that name", func(w *fencing.ProvenWrite) { w.Grant.UID = "other-uid" }, fencing.ReasonUnknownGrant},
		{"expired in the registry", func(w *fencing.ProvenWrite) { w.Now = time.Unix(100, 0) }, fencing.ReasonExpired},
		{"superseded", func(w *fencing.ProvenWrite) { w.Counter.Fence = r.Fence + 1 }, fencing.ReasonStaleOwner},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := valid()
			tc.mutate(&w)
			if got := fencing.ReasonOf(fencing.CheckProvenWrite(w)); got != tc.want {
				t.Fatalf("reason = %q, want %q", got, tc.want)
			}
		})
	}
}
