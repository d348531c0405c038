package fencing

// The rules of lockwarden's own fence records, FenceCounters and the
// FenceIssuer. The admission webhooks gather the facts and call them.

// CheckCounterName reports whether a FenceCounter named name may record
// resource: it must be named want, the name derived from the resource ID.
// It returns nil, or an *Error with ReasonInvalidSpec about the name.
func CheckCounterName(name, resource, want string) error {
	if name != want {
		return refuse(ReasonInvalidSpec, "the FenceCounter of resource %q must be named %q", resource, want)
	}
	return nil
}

// CheckCounterUpdate reports whether a FenceCounter's fence may move from
// old to updated: it never decreases (ReasonFenceRegression).
func CheckCounterUpdate(old, updated int64) error {
	if updated < old {
		return refuse(ReasonFenceRegression, "fence may never decrease (%d -> %d)", old, updated)
	}
	return nil
}

// CheckCounterDelete reports whether the FenceCounter of resource may be
// deleted: only with its namespace (namespaceTerminating). A counter
// recreated from zero would reissue fences that guarded objects and stores
// outside the cluster have already seen, even after every grant of the
// resource is gone. The refusal is ReasonCounterProtected.
func CheckCounterDelete(namespaceTerminating bool, resource string) error {
	if namespaceTerminating {
		return nil
	}
	return refuse(ReasonCounterProtected, "the fence record of resource %q is kept as long as its namespace: a new one would reissue fences from 1", resource)
}

// CheckIssuerDelete refuses to delete the fence issuer, always, with
// ReasonCounterProtected: a new issuer would start again at epoch 0 with no
// revoked epochs and a new key under an old key ID.
func CheckIssuerDelete() error {
	return &Error{Reason: ReasonCounterProtected,
		Detail: "deleting the issuer would restart epochs at 0 and forget revoked epochs and retired keys; change it instead"}
}
