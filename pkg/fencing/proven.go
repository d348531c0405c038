package fencing

// ProvenWrite is a guarded write that presents a signed grant record, with
// the facts to judge it.
type ProvenWrite struct {
	// Proof is the signed grant record the write carries.
	Proof Proof
	// Bundle is the verifier's trust bundle.
	Bundle *TrustBundle
	// GrantNamespace and GrantName are the grant the write names (its
	// annotation); empty GrantName means the write names only the proof.
	GrantNamespace, GrantName string
	// OperationRoot is the operation root the write claims, or empty.
	OperationRoot string
	// Policy and PolicyGeneration are the GuardPolicy covering the written
	// object and its current generation. When Policy is set, the record
	// must have been issued under that policy at a generation no newer
	// than PolicyGeneration; when empty, the record's policy is not checked.
	Policy           string
	PolicyGeneration int64
	// Write holds the resource, caller, fence, recorded fence and the
	// registry's facts; Grant must be the grant the record names, read
	// linearizably.
	Write
}

// CheckProvenWrite decides on a write that carries a grant proof. It
// returns nil, or an *Error for the first check that fails, in this order:
//
//  1. ReasonBadSignature: the proof does not verify under the trust bundle
//     (malformed, unknown or retired key, or a record changed after signing).
//  2. ReasonBindingMismatch: the record is not for exactly this write: another
//     namespace, resource, grant, fence (ReasonFenceNotIssued when the
//     write's fence is the record's rounded, see CheckIssued), operation
//     root or policy, or a
//     policy generation newer than the policy's (a proof replayed for
//     another resource, or a record forged around a real signature).
//  3. ReasonNotOwner: the caller is not the record's owner.
//  4. ReasonRevokedEpoch: the record's issuer epoch is revoked.
//  5. ReasonUnknownGrant: the registry has no grant with the record's lease ID.
//  6. then every rule of CheckWrite (liveness and fences).
//
// Nothing here changes state: an enforcement point records the accepted
// fence only when the whole check passes, so a failed authentication never
// moves a recorded fence.
func CheckProvenWrite(w ProvenWrite) error {
	if w.Bundle == nil {
		return refuse(ReasonBadSignature, "no trust bundle to verify the grant proof with")
	}
	r, err := w.Bundle.VerifyProof(w.Proof)
	if err != nil {
		return err
	}
	if err := checkBinding(r, w); err != nil {
		return err
	}
	if w.Caller != r.Owner {
		return refuse(ReasonNotOwner, "%q is not the owner %q of the grant record", w.Caller, r.Owner)
	}
	if w.Bundle.Revoked(r.IssuerEpoch) {
		return refuse(ReasonRevokedEpoch, "the grant was issued in revoked issuer epoch %d", r.IssuerEpoch)
	}
	if w.Grant == nil || w.Grant.UID != r.LeaseID {
		return refuse(ReasonUnknownGrant, "the registry has no grant with lease ID %q", r.LeaseID)
	}
	return CheckWrite(w.Write)
}

func checkBinding(r Record, w ProvenWrite) error {
	mismatch := func(what, got, want string) error {
		return refuse(ReasonBindingMismatch, "the grant record is for %s %q, the write is for %q", what, got, want)
	}
	switch {
	case r.Resource != w.Resource:
		return mismatch("resource", r.Resource, w.Resource)
	case w.GrantNamespace != "" && r.Namespace != w.GrantNamespace:
		return mismatch("namespace", r.Namespace, w.GrantNamespace)
	case w.GrantName != "" && r.Grant != w.GrantName:
		return mismatch("grant", r.Grant, w.GrantName)
	case r.Fence != w.Fence:
		if err := CheckIssued(w.Fence, &Grant{Fence: r.Fence}); err != nil {
			return err
		}
		return mismatch("fence", FormatFence(r.Fence), FormatFence(w.Fence))
	case w.OperationRoot != "" && r.OperationRoot != w.OperationRoot:
		return mismatch("operation root", r.OperationRoot, w.OperationRoot)
	case w.Policy != "" && r.Policy != w.Policy:
		return mismatch("policy", r.Policy, w.Policy)
	case w.Policy != "" && (r.PolicyGeneration < 1 || r.PolicyGeneration > w.PolicyGeneration):
		return refuse(ReasonBindingMismatch, "the grant record is for generation %d of policy %q, which is at generation %d", r.PolicyGeneration, w.Policy, w.PolicyGeneration)
	}
	return nil
}
