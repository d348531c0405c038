package fencing

import "errors"

// Reasons of the proof checks (see CheckProvenWrite).
const (
	// ReasonBadSignature: the grant proof is malformed, signed by an unknown
	// or retired key, or its signature does not match the record.
	ReasonBadSignature Reason = "BAD_SIGNATURE"
	// ReasonRevokedEpoch: the grant was issued in a revoked issuer epoch.
	ReasonRevokedEpoch Reason = "REVOKED_EPOCH"
	// ReasonRevoked: the issuer ended the grant before its lease ran out
	// (its epoch was revoked or superseded, or its policy stopped allowing it).
	ReasonRevoked Reason = "REVOKED"
)

var (
	ErrBadSignature = errors.New("fencing: bad signature")
	ErrRevokedEpoch = errors.New("fencing: revoked epoch")
	ErrRevoked      = errors.New("fencing: revoked")
)

func init() {
	sentinels[ReasonBadSignature] = ErrBadSignature
	sentinels[ReasonRevokedEpoch] = ErrRevokedEpoch
	sentinels[ReasonRevoked] = ErrRevoked
}
