package integration

// The tests in this file change the cluster-wide FenceIssuer (keys, epoch),
// which every later grant of the suite would see: they run last, from
// TestClusterWideState.

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func updateIssuer(t *testing.T, mutate func(*lockingv1alpha1.FenceIssuer)) {
	t.Helper()
	iss := &lockingv1alpha1.FenceIssuer{}
	if err := admin.Get(t.Context(), client.ObjectKey{Name: lockingv1alpha1.DefaultFenceIssuerName}, iss); err != nil {
		t.Fatal(err)
	}
	mutate(iss)
	if err := admin.Update(t.Context(), iss); err != nil {
		t.Fatal(err)
	}
}

// Rotation: a new key signs, the old one keeps verifying until retired; a
// retired key never verifies.
func testSigningKeyRotation(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "rot-a")
	const obj = "rotated"
	old := heldWithProof(t, a, ns)
	oldRec, _, _ := fencing.ParseProof(fencing.Proof(old.Status.Proof))

	updateIssuer(t, func(iss *lockingv1alpha1.FenceIssuer) {
		for i := range iss.Spec.SigningKeys {
			iss.Spec.SigningKeys[i].State = lockingv1alpha1.KeyVerify
		}
		iss.Spec.SigningKeys = append(iss.Spec.SigningKeys, lockingv1alpha1.SigningKey{KeyID: "k-rotated", State: lockingv1alpha1.KeyActive})
	})
	waitUntil(t, "the new key is published", func() (bool, error) {
		for _, k := range trustBundle(t).Keys {
			if k.KeyID == "k-rotated" {
				return true, nil
			}
		}
		return false, nil
	})
	if err := proofWrite(t, a, ns, obj, resource, old, fenceOf(old), old.Status.Proof, "old key"); err != nil {
		t.Fatalf("a record signed by the rotated-out key must still verify: %v", err)
	}
	if err := release(t, a, old); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, old, lockingv1alpha1.PhaseReleased)
	next := heldWithProof(t, a, ns)
	if next.Status.Record.KeyID != "k-rotated" {
		t.Fatalf("new grant signed by %q, want the new Active key", next.Status.Record.KeyID)
	}

	updateIssuer(t, func(iss *lockingv1alpha1.FenceIssuer) {
		for i := range iss.Spec.SigningKeys {
			if iss.Spec.SigningKeys[i].KeyID == oldRec.KeyID {
				iss.Spec.SigningKeys[i].State = lockingv1alpha1.KeyRetired
			}
		}
	})
	waitUntil(t, "a proof of the retired key is refused", func() (bool, error) {
		err := proofWrite(t, a, ns, "retired", resource, next, fenceOf(next), old.Status.Proof, "retired key")
		return reason(err) == "BAD_SIGNATURE", nil
	})
	if err := proofWrite(t, a, ns, obj, resource, next, fenceOf(next), next.Status.Proof, "new key"); err != nil {
		t.Fatalf("the new key's proof: %v", err)
	}
}

// Revoking an epoch makes its grants fail verification and ends its Held
// grants; the next fence is above every fence of the earlier epoch.
func testRevokedIssuerEpoch(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "ep-a"), as(t, "ep-b")
	const obj = "epoch-ledger"
	ga := heldWithProof(t, a, ns)
	if err := proofWrite(t, a, ns, obj, resource, ga, fenceOf(ga), ga.Status.Proof, "epoch-0"); err != nil {
		t.Fatal(err)
	}
	var oldEpoch int64
	updateIssuer(t, func(iss *lockingv1alpha1.FenceIssuer) {
		oldEpoch = iss.Spec.Epoch
		iss.Spec.Epoch++
		iss.Spec.RevokedEpochs = append(iss.Spec.RevokedEpochs, oldEpoch)
	})
	ga = waitPhase(t, ga, lockingv1alpha1.PhaseRevoked)
	waitUntil(t, "a proof of the revoked epoch is refused", func() (bool, error) {
		err := proofWrite(t, a, ns, obj, resource, ga, fenceOf(ga), ga.Status.Proof, "revoked")
		return reason(err) == "REVOKED_EPOCH", nil
	})
	if data, fence := readCM(t, ns, obj); data != "epoch-0" || fence != fenceOf(ga) {
		t.Fatalf("object = %q at fence %s after the refused write", data, fence)
	}
	gb := heldWithProof(t, b, ns)
	if fencing.EpochOf(gb.Status.FenceToken) != oldEpoch+1 || gb.Status.FenceToken <= ga.Status.FenceToken {
		t.Fatalf("fence after the epoch bump = %d (epoch %d), want the first of epoch %d", gb.Status.FenceToken, fencing.EpochOf(gb.Status.FenceToken), oldEpoch+1)
	}
	if err := proofWrite(t, b, ns, obj, resource, gb, fenceOf(gb), gb.Status.Proof, "epoch-1"); err != nil {
		t.Fatalf("a write of the new epoch: %v", err)
	}
}
