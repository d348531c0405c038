package integration

// These tests change the cluster-wide FenceIssuer's epoch; the file name
// sorts among the last so that they run after the others.

import (
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// An operator raises a counter to the last fence of the issuer's epoch
// (3<<40 | 2^40-1). The next request is not granted 4<<40|0, a fence that
// claims epoch 4 while the issuer is at 3 and that revoking epochs 0..3
// would leave Held and writing: it waits, told to raise the epoch. Once
// the issuer is at 4 with 0..3 revoked, it is granted the first fence of
// epoch 4, and no Held grant of an epoch up to 3 is left to write.
func TestZZExhaustedSequenceNeverCarriesIntoTheEpoch(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	issuerEpoch(t)
	updateIssuer(t, func(iss *lockingv1alpha1.FenceIssuer) { iss.Spec.Epoch = max(iss.Spec.Epoch, 3) })
	epoch := issuerEpoch(t)
	raiseCounter(t, ns, resource, epoch<<fencing.EpochBits|fencing.MaxSequence)

	b, err := acquire(t, as(t, "seq-b"), ns, 60)
	if err != nil {
		t.Fatal(err)
	}
	next := fencing.FormatFence(epoch + 1)
	waitHeldBack(t, b, lockingv1alpha1.LockGrantReasonSequenceExhausted, "spec.epoch to "+next+" or more")
	waitEvent(t, ns, "LockGrant", b.Name, lockingv1alpha1.LockGrantReasonSequenceExhausted, "sequence of issuer epoch")
	waitEvent(t, "default", "FenceIssuer", lockingv1alpha1.DefaultFenceIssuerName, lockingv1alpha1.LockGrantReasonSequenceExhausted, b.Name)

	updateIssuer(t, func(iss *lockingv1alpha1.FenceIssuer) {
		iss.Spec.Epoch = epoch + 1
		for e := range epoch + 1 {
			if !slices.Contains(iss.Spec.RevokedEpochs, e) {
				iss.Spec.RevokedEpochs = append(iss.Spec.RevokedEpochs, e)
			}
		}
	})
	b = waitPhase(t, b, lockingv1alpha1.PhaseHeld)
	if f := b.Status.FenceToken; fencing.EpochOf(f) != epoch+1 || fencing.SequenceOf(f) != 1 || b.Status.Record == nil || b.Status.Record.IssuerEpoch != epoch+1 {
		t.Fatalf("fence %d (epoch %d, sequence %d), record %+v; want the first fence of epoch %d", f, fencing.EpochOf(f), fencing.SequenceOf(f), b.Status.Record, epoch+1)
	}
	if err := write(t, as(t, "seq-b"), ns, "ledger", b, fenceOf(b), "b"); err != nil {
		t.Fatalf("the new epoch's holder writing: %v", err)
	}

	var grants lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &grants, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, g := range grants.Items {
		if g.Status.Phase == lockingv1alpha1.PhaseHeld && fencing.EpochOf(g.Status.FenceToken) <= epoch {
			t.Errorf("grant %s is Held with fence %d of revoked epoch %d", g.Name, g.Status.FenceToken, fencing.EpochOf(g.Status.FenceToken))
		}
	}
}
