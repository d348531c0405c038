package grantplan

import (
	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Signed is the signed grant record of a grant that becomes Held: what
// the caller sets in its status (status.record and status.proof) before
// writing it. A record, once published, never changes.
type Signed struct {
	// Grant is the grant of the plan the record is for.
	Grant *lockingv1alpha1.LockGrant
	// Record is the record's fields, for status.record.
	Record *lockingv1alpha1.GrantRecord
	// Proof is the record signed with the issuer's key, for status.proof.
	Proof string
}

// Sign signs the grant record of every grant that becomes Held in plan p,
// with the issuer's Active key (params.KeyID, params.Key). revision is the
// FenceCounter's resourceVersion after the fence was issued. It leaves p
// as it is: the caller sets each record in its grant's status.
func Sign(p Plan, params issuer.Params, revision string) []Signed {
	return SignSlots(p, params, func(int32) string { return revision })
}

// SignSlots is Sign for a resource with permits: revision(k) is the
// resourceVersion of slot k's FenceCounter after the fence was issued. The
// record names the grant's fenced resource ID (the slot's), so that a
// verifier bound to another slot refuses it.
func SignSlots(p Plan, params issuer.Params, revision func(slot int32) string) []Signed {
	var signed []Signed
	for _, g := range p.Statuses {
		st := &g.Status
		if st.Phase != lockingv1alpha1.PhaseHeld || st.Record != nil {
			continue
		}
		r := fencing.Record{
			Namespace:        g.Namespace,
			Resource:         g.HeldFencedResource(),
			Owner:            g.Spec.Owner,
			RequestID:        g.Spec.RequestID,
			Grant:            g.Name,
			LeaseID:          string(g.UID),
			OperationRoot:    g.Spec.OperationRoot,
			OperationClass:   g.Spec.OperationClass,
			Fence:            st.FenceToken,
			BackendRevision:  revision(g.HeldSlot()),
			Policy:           g.Spec.Policy,
			PolicyGeneration: p.PolicyGenerations[g.Spec.Policy],
			// A fence's epoch bits are the epoch that issued it:
			// fencing.NextFence never carries a sequence into them.
			IssuerEpoch: fencing.EpochOf(st.FenceToken),
			TTLSeconds:  int64(g.Spec.LeaseDurationSeconds),
			KeyID:       params.KeyID,
		}
		signed = append(signed, Signed{
			Grant: g,
			Proof: string(fencing.Sign(r, params.Key)),
			Record: &lockingv1alpha1.GrantRecord{
				Schema: fencing.RecordSchema, Resource: r.Resource, Owner: r.Owner, RequestID: r.RequestID,
				LeaseID: r.LeaseID, OperationRoot: r.OperationRoot, OperationClass: r.OperationClass,
				FenceToken: r.Fence, BackendRevision: r.BackendRevision, Policy: r.Policy,
				PolicyGeneration: r.PolicyGeneration, IssuerEpoch: r.IssuerEpoch, TTLSeconds: r.TTLSeconds, KeyID: r.KeyID,
			},
		})
	}
	return signed
}
