package fencing_test

import (
	"crypto/ed25519"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A record counts as a floor only where nobody but lockwarden can have
// written it: on an object guarded now, or with a proof the issuer signed
// for the fence it records.
func TestCountFloor(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle := &fencing.TrustBundle{Schema: fencing.TrustBundleSchema, Keys: []fencing.TrustedKey{{KeyID: "k", Algorithm: "Ed25519", PublicKey: pub, State: fencing.KeyActive}}}
	rec := fencing.Record{Namespace: "billing", Resource: "ledger", Fence: 7, KeyID: "k"}
	signed := string(fencing.Sign(rec, key))
	forged := string(fencing.FormatProof(rec, make([]byte, 64)))
	tests := []struct {
		name    string
		r       fencing.RecordedFloor
		want    int64
		isProof bool
	}{
		{"guarded", fencing.RecordedFloor{Guarded: true, Fence: "7"}, 7, false},
		{"guarded, an unverifiable proof", fencing.RecordedFloor{Guarded: true, Fence: "7", Proof: forged, Verify: bundle.VerifyProof}, 7, false},
		{"not guarded, signed", fencing.RecordedFloor{Fence: "7", Proof: signed, Verify: bundle.VerifyProof}, 7, true},
		{"not guarded, signed for another fence", fencing.RecordedFloor{Fence: "9223372036854775807", Proof: signed, Verify: bundle.VerifyProof}, 0, false},
		{"not guarded, forged proof", fencing.RecordedFloor{Fence: "7", Proof: forged, Verify: bundle.VerifyProof}, 0, false},
		{"not guarded, no bundle", fencing.RecordedFloor{Fence: "7", Proof: signed}, 0, false},
		{"not guarded, no proof", fencing.RecordedFloor{Fence: "7"}, 0, false},
		{"override", fencing.RecordedFloor{Guarded: true, Fence: "7", Intent: fencing.IntentOverride}, 0, false},
		{"2^63", fencing.RecordedFloor{Guarded: true, Fence: "9223372036854775808"}, 0, false},
		{"negative", fencing.RecordedFloor{Guarded: true, Fence: "-7"}, 0, false},
		{"zero", fencing.RecordedFloor{Guarded: true, Fence: "0"}, 0, false},
		{"hex", fencing.RecordedFloor{Guarded: true, Fence: "0x7"}, 0, false},
		{"leading zero", fencing.RecordedFloor{Guarded: true, Fence: "07"}, 0, false},
		{"empty", fencing.RecordedFloor{Guarded: true}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, r, ok := fencing.CountFloor(tc.r)
			if got != tc.want || ok != (tc.want != 0) || (r != nil) != tc.isProof {
				t.Fatalf("CountFloor = %d, %+v, %v; want %d, signed %v", got, r, ok, tc.want, tc.isProof)
			}
			if r != nil && (r.Namespace != "billing" || r.Resource != "ledger") {
				t.Fatalf("signed record %+v", r)
			}
		})
	}
}
