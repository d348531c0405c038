package fencing_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

var update = flag.Bool("update", false, "rewrite the test vectors in testdata/grant-record")

// testKey derives a fixed Ed25519 key from a name, for reproducible vectors.
func testKey(name string) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, name)
	return ed25519.NewKeyFromSeed(seed)
}

func sampleRecord() fencing.Record {
	return fencing.Record{
		Namespace: "billing", Resource: "invoice-batch/2026-07-19", Owner: "system:serviceaccount:billing:settlement-7",
		RequestID: "settlement-7-run-1", Grant: "req-3f1c", LeaseID: "6c1b2a4e-0f4b-4a53-9d0e-2f6f7a1e9c11",
		OperationRoot: "sha256:51c0e0b7a9f1d6c44a07d56f0b1b3e4fb1a9f3e0e2c6d7a8b9c0d1e2f3a4b5c6", OperationClass: "settlement",
		Fence: 8842, BackendRevision: "1920184", Policy: "billing-batches", PolicyGeneration: 12,
		IssuerEpoch: 0, TTLSeconds: 10, KeyID: "k1",
	}
}

// vector is one test vector file: record -> canonical bytes -> digest ->
// signature -> proof, for verifiers written in other languages.
type vector struct {
	Description  string          `json:"description"`
	Record       fencing.Record  `json:"record"`
	Canonical    string          `json:"canonical"`
	DigestHex    string          `json:"digestSHA256Hex"`
	PrivateSeed  string          `json:"ed25519PrivateSeedBase64"`
	PublicKey    string          `json:"ed25519PublicKeyBase64"`
	SignatureB64 string          `json:"signatureBase64URL"`
	Proof        fencing.Proof   `json:"proof"`
	TrustBundle  json.RawMessage `json:"trustBundle"`
}

func makeVector(desc string, r fencing.Record, key ed25519.PrivateKey) vector {
	d := r.Digest()
	sig := ed25519.Sign(key, d[:])
	b := &fencing.TrustBundle{Keys: []fencing.TrustedKey{{KeyID: r.KeyID, Algorithm: "Ed25519", PublicKey: key.Public().(ed25519.PublicKey), State: fencing.KeyActive}}}
	bj, _ := b.Marshal()
	return vector{
		Description: desc, Record: r, Canonical: string(r.Canonical()), DigestHex: hex.EncodeToString(d[:]),
		PrivateSeed: base64.StdEncoding.EncodeToString(key.Seed()), PublicKey: base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey)),
		SignatureB64: base64.RawURLEncoding.EncodeToString(sig), Proof: fencing.FormatProof(r, sig), TrustBundle: bj,
	}
}

func TestVectors(t *testing.T) {
	unicode := sampleRecord()
	unicode.Owner, unicode.Policy, unicode.PolicyGeneration, unicode.OperationRoot = "user:zoë:ops", "", 0, ""
	epoch := sampleRecord()
	epoch.IssuerEpoch, epoch.Fence = 3, 3<<fencing.EpochBits|1
	want := map[string]vector{
		"settlement.json":     makeVector("an invoice-batch settlement grant", sampleRecord(), testKey("lockwarden-test-key-1")),
		"no-policy-utf8.json": makeVector("no policy, no operation root, a non-ASCII owner", unicode, testKey("lockwarden-test-key-1")),
		"epoch-3.json":        makeVector("first fence of issuer epoch 3", epoch, testKey("lockwarden-test-key-2")),
	}
	for name, v := range want {
		path := filepath.Join("testdata", "grant-record", name)
		if *update {
			data, _ := json.MarshalIndent(v, "", "  ")
			if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestVectors -update)", err)
		}
		var got vector
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		// The stored vector must be reproducible from its own inputs.
		if string(got.Record.Canonical()) != got.Canonical {
			t.Errorf("%s: canonical encoding changed", name)
		}
		d := got.Record.Digest()
		if hex.EncodeToString(d[:]) != got.DigestHex {
			t.Errorf("%s: digest changed", name)
		}
		seed, _ := base64.StdEncoding.DecodeString(got.PrivateSeed)
		if p := fencing.Sign(got.Record, ed25519.NewKeyFromSeed(seed)); p != got.Proof {
			t.Errorf("%s: proof changed", name)
		}
		b, err := fencing.ParseTrustBundle(got.TrustBundle)
		if err != nil {
			t.Fatal(err)
		}
		r, err := b.VerifyProof(got.Proof)
		if err != nil || !reflect.DeepEqual(r, got.Record) {
			t.Errorf("%s: VerifyProof = %+v, %v", name, r, err)
		}
	}
}

func bundle(keys ...fencing.TrustedKey) *fencing.TrustBundle { return &fencing.TrustBundle{Keys: keys} }

func trusted(id string, key ed25519.PrivateKey, s fencing.KeyState) fencing.TrustedKey {
	return fencing.TrustedKey{KeyID: id, Algorithm: "Ed25519", PublicKey: key.Public().(ed25519.PublicKey), State: s}
}

func TestVerifyProofKeyRotation(t *testing.T) {
	k1, k2 := testKey("one"), testKey("two")
	r1 := sampleRecord()
	r2 := sampleRecord()
	r2.KeyID = "k2"
	p1, p2 := fencing.Sign(r1, k1), fencing.Sign(r2, k2)
	tests := []struct {
		name   string
		b      *fencing.TrustBundle
		p      fencing.Proof
		wantOK bool
	}{
		{"active key", bundle(trusted("k1", k1, fencing.KeyActive)), p1, true},
		{"rotated: old key still verifies", bundle(trusted("k1", k1, fencing.KeyVerify), trusted("k2", k2, fencing.KeyActive)), p1, true},
		{"rotated: new key verifies", bundle(trusted("k1", k1, fencing.KeyVerify), trusted("k2", k2, fencing.KeyActive)), p2, true},
		{"retired key never verifies", bundle(trusted("k1", k1, fencing.KeyRetired), trusted("k2", k2, fencing.KeyActive)), p1, false},
		{"unknown key ID", bundle(trusted("k2", k2, fencing.KeyActive)), p1, false},
		{"key ID moved onto another key", bundle(trusted("k1", k2, fencing.KeyActive)), p1, false},
		{"unknown state", bundle(trusted("k1", k1, "Maybe")), p1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.b.VerifyProof(tc.p)
			if tc.wantOK != (err == nil) {
				t.Fatalf("VerifyProof = %v, want ok=%v", err, tc.wantOK)
			}
			if err != nil && fencing.ReasonOf(err) != fencing.ReasonBadSignature {
				t.Fatalf("reason = %q, want BAD_SIGNATURE", fencing.ReasonOf(err))
			}
		})
	}
}

// Every field of the record is covered by the signature.
func TestTamperedRecordFieldsDoNotVerify(t *testing.T) {
	key := testKey("one")
	b := bundle(trusted("k1", key, fencing.KeyActive))
	orig := sampleRecord()
	_, sig, err := fencing.ParseProof(fencing.Sign(orig, key))
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(&orig).Elem()
	for i := range v.NumField() {
		tampered := orig
		f := reflect.ValueOf(&tampered).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int64:
			f.SetInt(f.Int() + 1)
		}
		if _, err := b.VerifyProof(fencing.FormatProof(tampered, sig)); fencing.ReasonOf(err) != fencing.ReasonBadSignature {
			t.Errorf("record with %s changed: %v, want BAD_SIGNATURE", v.Type().Field(i).Name, err)
		}
	}
}

func TestParseProofRejectsMalformed(t *testing.T) {
	good := string(fencing.Sign(sampleRecord(), testKey("one")))
	for _, p := range []string{"", "lgv1.", "lgv2.abc.def", "lgv1.abc", "lgv1.!!!.abc", good + "x!", good[:len(good)/2]} {
		if _, _, err := fencing.ParseProof(fencing.Proof(p)); fencing.ReasonOf(err) != fencing.ReasonBadSignature {
			t.Errorf("ParseProof(%.30q...) = %v, want BAD_SIGNATURE", p, err)
		}
	}
}
