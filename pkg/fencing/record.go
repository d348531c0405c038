package fencing

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// RecordSchema is the schema name of grant records this package reads and
// writes.
const RecordSchema = "lockGrant.v1"

// Record is a grant record (lockGrant.v1): the immutable description of one
// grant that the issuer signs when the grant becomes Held. Any enforcement
// point, in the cluster or outside it, can check with the issuer's public
// keys alone that a write carries a real grant for exactly this resource,
// owner, lease and operation; whether the grant is still current is a
// separate, linearizable question for the registry.
//
// The canonical encoding (see Canonical and docs/grant-record.md) covers
// every field, so changing any of them breaks the signature.
type Record struct {
	// Namespace is the namespace of the grant; resource IDs are scoped to it.
	Namespace string `json:"namespace"`
	// Resource is the resource ID.
	Resource string `json:"resource"`
	// Owner is the workload identity that holds the grant.
	Owner string `json:"owner"`
	// RequestID is the client's idempotency key; may be empty.
	RequestID string `json:"requestID"`
	// Grant is the LockGrant's name.
	Grant string `json:"grant"`
	// LeaseID is the LockGrant's UID: the per-acquisition owner token.
	LeaseID string `json:"leaseID"`
	// OperationRoot is the sha256 digest the requester bound the grant to,
	// as "sha256:<64 hex>", or empty.
	OperationRoot string `json:"operationRoot"`
	// OperationClass is the requester's class of operation; may be empty.
	OperationClass string `json:"operationClass"`
	// Fence is the fencing token, >= 1.
	Fence int64 `json:"fence"`
	// BackendRevision is the FenceCounter's resourceVersion right after the
	// fence was issued. Opaque: compare for equality only.
	BackendRevision string `json:"backendRevision"`
	// Policy is the GuardPolicy the grant was issued under, or empty.
	Policy string `json:"policy"`
	// PolicyGeneration is that policy's metadata.generation at issue; 0
	// without a policy.
	PolicyGeneration int64 `json:"policyGeneration"`
	// IssuerEpoch is the issuer epoch at issue; fences of a later epoch are
	// always larger (see EpochOf).
	IssuerEpoch int64 `json:"issuerEpoch"`
	// TTLSeconds is the lease duration, in seconds.
	TTLSeconds int64 `json:"ttlSeconds"`
	// KeyID names the signing key. It is part of the signed payload, so a
	// signature cannot be moved under another key.
	KeyID string `json:"keyID"`
}

// field is one canonical field: its name and its value as text.
type field struct{ name, value string }

func (r Record) fields() []field {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []field{
		{"schema", RecordSchema},
		{"namespace", r.Namespace},
		{"resource", r.Resource},
		{"owner", r.Owner},
		{"requestID", r.RequestID},
		{"grant", r.Grant},
		{"leaseID", r.LeaseID},
		{"operationRoot", r.OperationRoot},
		{"operationClass", r.OperationClass},
		{"fence", i(r.Fence)},
		{"backendRevision", r.BackendRevision},
		{"policy", r.Policy},
		{"policyGeneration", i(r.PolicyGeneration)},
		{"issuerEpoch", i(r.IssuerEpoch)},
		{"ttlSeconds", i(r.TTLSeconds)},
		{"keyID", r.KeyID},
	}
}

// Canonical returns the record's canonical encoding: for each field, in the
// fixed order of docs/grant-record.md, the bytes
//
//	NAME ":" LEN ":" VALUE "\n"
//
// where NAME is the ASCII field name, LEN the byte length of VALUE in
// decimal, and VALUE the UTF-8 value (integers in decimal, no sign for
// non-negative values, no leading zeros). The length prefix makes the
// encoding unambiguous without escaping.
func (r Record) Canonical() []byte {
	var b bytes.Buffer
	for _, f := range r.fields() {
		fmt.Fprintf(&b, "%s:%d:%s\n", f.name, len(f.value), f.value)
	}
	return b.Bytes()
}

// Digest returns SHA-256 of the canonical encoding: the 32 bytes that are
// signed.
func (r Record) Digest() [32]byte { return sha256.Sum256(r.Canonical()) }

// ParseCanonical decodes a canonical encoding. It accepts exactly the
// output of Canonical: every field once, in order, well-formed integers,
// nothing after the last field. Anything else is refused with
// ReasonBadSignature.
func ParseCanonical(b []byte) (Record, error) {
	bad := func(format string, args ...any) (Record, error) {
		return Record{}, refuse(ReasonBadSignature, "grant record: "+format, args...)
	}
	values := make([]string, 0, 16)
	names := Record{}.fields()
	for _, want := range names {
		name, rest, ok := bytes.Cut(b, []byte(":"))
		if !ok || string(name) != want.name {
			return bad("expected field %q", want.name)
		}
		lenText, rest, ok := bytes.Cut(rest, []byte(":"))
		n, err := strconv.Atoi(string(lenText))
		if !ok || err != nil || n < 0 || n > len(rest)-1 || strconv.Itoa(n) != string(lenText) {
			return bad("bad length of field %q", want.name)
		}
		if rest[n] != '\n' {
			return bad("field %q does not end with a newline", want.name)
		}
		values = append(values, string(rest[:n]))
		b = rest[n+1:]
	}
	if len(b) != 0 {
		return bad("trailing bytes after the last field")
	}
	if values[0] != RecordSchema {
		return bad("unknown schema %q", values[0])
	}
	ints := make([]int64, 0, 4)
	for _, idx := range []int{9, 12, 13, 14} {
		v, err := strconv.ParseInt(values[idx], 10, 64)
		if err != nil || strconv.FormatInt(v, 10) != values[idx] {
			return bad("field %q is not a canonical integer", names[idx].name)
		}
		ints = append(ints, v)
	}
	r := Record{
		Namespace: values[1], Resource: values[2], Owner: values[3], RequestID: values[4],
		Grant: values[5], LeaseID: values[6], OperationRoot: values[7], OperationClass: values[8],
		Fence: ints[0], BackendRevision: values[10], Policy: values[11],
		PolicyGeneration: ints[1], IssuerEpoch: ints[2], TTLSeconds: ints[3], KeyID: values[15],
	}
	return r, nil
}

// Proof is a signed grant record in its compact text form, as it travels in
// the LockGrant status and in the proof annotation of a guarded write:
//
//	"lgv1." BASE64URL(canonical record) "." BASE64URL(Ed25519 signature of the digest)
//
// with unpadded base64url (RFC 4648 section 5). The key ID is inside the
// record.
type Proof string

const proofPrefix = "lgv1."

var b64 = base64.RawURLEncoding

// ParseProof splits a proof into its record and signature. A malformed
// proof is refused with ReasonBadSignature.
func ParseProof(p Proof) (Record, []byte, error) {
	s, ok := strings.CutPrefix(string(p), proofPrefix)
	if !ok {
		return Record{}, nil, refuse(ReasonBadSignature, "not a lgv1 grant proof")
	}
	payload, sigText, ok := strings.Cut(s, ".")
	if !ok {
		return Record{}, nil, refuse(ReasonBadSignature, "grant proof has no signature")
	}
	canonical, err := b64.DecodeString(payload)
	if err != nil {
		return Record{}, nil, refuse(ReasonBadSignature, "grant proof record is not base64url")
	}
	sig, err := b64.DecodeString(sigText)
	if err != nil {
		return Record{}, nil, refuse(ReasonBadSignature, "grant proof signature is not base64url")
	}
	r, err := ParseCanonical(canonical)
	if err != nil {
		return Record{}, nil, err
	}
	return r, sig, nil
}

// FormatProof assembles a proof from a record and its signature.
func FormatProof(r Record, sig []byte) Proof {
	return Proof(proofPrefix + b64.EncodeToString(r.Canonical()) + "." + b64.EncodeToString(sig))
}
