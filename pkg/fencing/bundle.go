package fencing

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"slices"
)

// TrustBundleSchema names the JSON format of a trust bundle.
const TrustBundleSchema = "lockwarden.trustBundle.v1"

// KeyState is the life stage of a signing key.
type KeyState string

const (
	// KeyActive signs new grant records, and verifies.
	KeyActive KeyState = "Active"
	// KeyVerify no longer signs but still verifies records it signed.
	KeyVerify KeyState = "Verify"
	// KeyRetired never verifies again.
	KeyRetired KeyState = "Retired"
)

// TrustedKey is one public key of a trust bundle.
type TrustedKey struct {
	// KeyID names the key; records carry it.
	KeyID string `json:"keyID"`
	// Algorithm is always "Ed25519".
	Algorithm string `json:"algorithm"`
	// PublicKey is the 32-byte Ed25519 public key, standard base64 in JSON.
	PublicKey []byte `json:"publicKey"`
	// State is Active, Verify or Retired.
	State KeyState `json:"state"`
}

// TrustBundle is what a verifier needs from the issuer: its public keys and
// its revoked epochs. The issuer publishes it as JSON (the ConfigMap
// lockwarden-trust-bundle, key trust-bundle.json); out-of-cluster
// verifiers load an exported copy with ParseTrustBundle.
type TrustBundle struct {
	Schema string `json:"schema"`
	// Keys are the issuer's public keys.
	Keys []TrustedKey `json:"keys"`
	// CurrentEpoch is the epoch new grants are issued in.
	CurrentEpoch int64 `json:"currentEpoch"`
	// RevokedEpochs are epochs whose grants never verify again.
	RevokedEpochs []int64 `json:"revokedEpochs,omitempty"`
}

// ParseTrustBundle decodes a trust bundle from JSON and checks its shape.
func ParseTrustBundle(data []byte) (*TrustBundle, error) {
	b := &TrustBundle{}
	if err := json.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	if b.Schema != TrustBundleSchema {
		return nil, fmt.Errorf("trust bundle: schema %q, want %q", b.Schema, TrustBundleSchema)
	}
	for _, k := range b.Keys {
		if k.Algorithm != "Ed25519" || len(k.PublicKey) != ed25519.PublicKeySize || k.KeyID == "" {
			return nil, fmt.Errorf("trust bundle: key %q is not a well-formed Ed25519 key", k.KeyID)
		}
	}
	return b, nil
}

// Marshal encodes the bundle as JSON.
func (b *TrustBundle) Marshal() ([]byte, error) {
	c := *b
	c.Schema = TrustBundleSchema
	return json.MarshalIndent(c, "", "  ")
}

// Revoked reports whether grants of epoch are revoked.
func (b *TrustBundle) Revoked(epoch int64) bool { return slices.Contains(b.RevokedEpochs, epoch) }

// VerifyProof checks a proof's signature and returns its record. It returns
// an *Error with ReasonBadSignature when the proof is malformed, its key is
// unknown or retired, or the signature does not match the record's digest.
func (b *TrustBundle) VerifyProof(p Proof) (Record, error) {
	r, sig, err := ParseProof(p)
	if err != nil {
		return Record{}, err
	}
	i := slices.IndexFunc(b.Keys, func(k TrustedKey) bool { return k.KeyID == r.KeyID })
	if i < 0 {
		return Record{}, refuse(ReasonBadSignature, "grant proof signed by unknown key %q", r.KeyID)
	}
	k := b.Keys[i]
	if k.State != KeyActive && k.State != KeyVerify {
		return Record{}, refuse(ReasonBadSignature, "grant proof signed by retired key %q", r.KeyID)
	}
	d := r.Digest()
	if len(k.PublicKey) != ed25519.PublicKeySize || !ed25519.Verify(ed25519.PublicKey(k.PublicKey), d[:], sig) {
		return Record{}, refuse(ReasonBadSignature, "grant proof signature does not match its record")
	}
	return r, nil
}

// Sign signs a record with an Ed25519 private key; r.KeyID must name it.
// The signature covers r.Digest(), so it is Ed25519 over 32 bytes.
func Sign(r Record, key ed25519.PrivateKey) Proof {
	d := r.Digest()
	return FormatProof(r, ed25519.Sign(key, d[:]))
}
