// Package admissionpolicy tests the ValidatingAdmissionPolicy that judges
// updates of LockGrants inside the API server (config/policy) against the
// rules it restates, fencing.CheckGrantUpdate: the same cases go through
// both, on a real kube-apiserver with the policy and no webhook, and must
// get the same verdicts, reason codes included.
package admissionpolicy
