package grantplan

import (
	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Sign publishes the signed grant record of every grant that becomes Held in
// this pass. revision is the FenceCounter's resourceVersion after the fence
// was issued. A record, once published, never changes.
func Sign(p Plan, params issuer.Params, revision string) {
	SignSlots(p, params, func(int32) string { return revision })
}

// SignSlots is Sign for a resource with permits: revision(k) is the
// resourceVersion of slot k's FenceCounter after the fence was issued. The
// record names the grant's fenced resource ID (the slot's), so that a
// verifier bound to another slot refuses it.
func SignSlots(p Plan, params issuer.Params, revision func(slot int32) string) {
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
		st.Proof = string(fencing.Sign(r, params.Key))
		st.Record = &lockingv1alpha1.GrantRecord{
			Schema: fencing.RecordSchema, Resource: r.Resource, Owner: r.Owner, RequestID: r.RequestID,
			LeaseID: r.LeaseID, OperationRoot: r.OperationRoot, OperationClass: r.OperationClass,
			FenceToken: r.Fence, BackendRevision: r.BackendRevision, Policy: r.Policy,
			PolicyGeneration: r.PolicyGeneration, IssuerEpoch: r.IssuerEpoch, TTLSeconds: r.TTLSeconds, KeyID: r.KeyID,
		}
	}
}
