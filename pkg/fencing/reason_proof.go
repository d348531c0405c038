package fencing

import "errors"

// Reasons of the proof checks (see CheckProvenWrite).
const (
	// ReasonBadSignature: the grant proof is malformed, signed by an unknown
	// or retired key, or its signature does not match the record.
	ReasonBadSignature Reason = "BAD_SIGNATURE"
	// ReasonRevokedEpoch: the grant was issued in a revoked issuer epoch.
	ReasonRevokedEpoch Reason = "REVOKED_EPOCH"
)

var (
	ErrBadSignature = errors.New("fencing: bad signature")
	ErrRevokedEpoch = errors.New("fencing: revoked epoch")
)

func init() {
	sentinels[ReasonBadSignature] = ErrBadSignature
	sentinels[ReasonRevokedEpoch] = ErrRevokedEpoch
}
