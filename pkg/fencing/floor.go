package fencing

// RecordedFloor is what a scan for fence floors finds on one object
// (internal/recovery): the record admission writes on each write it
// accepts (the annotations locking.lockwarden.io/accepted-fence,
// accepted-intent and accepted-proof), and whether the object is guarded
// now.
type RecordedFloor struct {
	// Guarded reports whether the object is guarded now: by the label
	// (value "true") or by a GuardPolicy in Enforce mode. Every write to
	// such an object went through admission, which wrote its whole record
	// (a write that sets the label is itself a guarded write), so nobody
	// else can have written it.
	Guarded bool
	// Fence, Intent and Proof are the record's annotations as found.
	Fence, Intent, Proof string
	// Verify checks a proof's signature against the issuer's trust bundle
	// (TrustBundle.VerifyProof); nil when no bundle could be read.
	Verify func(Proof) (Record, error)
}

// CountFloor returns the fence a recorded write counts for as a floor: a
// fence the registry never issues at or below again (NextFenceAbove). A
// floor holds back every request for its resource whose counter is behind
// it, whoever made the request, so a record counts only where nobody but
// lockwarden can have written it:
//
//   - on an object guarded now (r.Guarded), as admission wrote it;
//   - on any other object (one no longer guarded, under a Shadow policy,
//     or never guarded, which anyone allowed to annotate it can write),
//     only when its proof verifies (signed by the issuer) and names the
//     fence the record carries: signed is then that record, whose
//     namespace and resource the floor is attributed to, never the
//     object's own annotations.
//
// An administrator's override (intent IntentOverride, a wedged object
// being retired) and a value admission never writes (ParseFence refuses
// it: signed, zero, negative, not decimal, or 2^63 and above) count for
// nothing. ok is false when the record does not count.
func CountFloor(r RecordedFloor) (fence int64, signed *Record, ok bool) {
	if r.Intent == IntentOverride {
		return 0, nil, false
	}
	fence, err := ParseFence(r.Fence)
	if err != nil {
		return 0, nil, false
	}
	if r.Proof != "" && r.Verify != nil {
		if rec, err := r.Verify(Proof(r.Proof)); err == nil && rec.Fence == fence {
			return fence, &rec, true
		}
	}
	if r.Guarded {
		return fence, nil, true
	}
	return 0, nil, false
}
