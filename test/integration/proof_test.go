package integration

import (
	"reflect"
	"strings"
	"testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// proofWrite is a guarded write carrying grant g's proof.
func proofWrite(t *testing.T, a *actor, ns, obj, res string, g *lockingv1alpha1.LockGrant, fence string, proof string, data string) error {
	t.Helper()
	return writeCM(t, a, ns, obj, data, map[string]string{
		lockingv1alpha1.ResourceAnnotation: res,
		lockingv1alpha1.GrantAnnotation:    g.Name,
		lockingv1alpha1.FenceAnnotation:    fence,
		lockingv1alpha1.ProofAnnotation:    proof,
	}, map[string]string{lockingv1alpha1.GuardedLabel: "true"})
}

// heldWithProof acquires for a and returns the Held grant with its record.
func heldWithProof(t *testing.T, a *actor, ns string) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := mustAcquire(t, a, ns, 60)
	if g.Status.Proof == "" || g.Status.Record == nil {
		t.Fatalf("Held grant has no signed record: %+v", g.Status)
	}
	return g
}

// A Held grant publishes a record that matches the grant and verifies.
func TestHeldGrantPublishesSignedRecord(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "rec-a")
	g, err := acquire(t, a, ns, 30, func(g *lockingv1alpha1.LockGrant) {
		g.Spec.RequestID = "rec-run-1"
		g.Spec.OperationRoot = "sha256:" + strings.Repeat("ab", 32)
		g.Spec.OperationClass = "settlement"
	})
	if err != nil {
		t.Fatal(err)
	}
	g = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
	r, sig, err := fencing.ParseProof(fencing.Proof(g.Status.Proof))
	if err != nil || len(sig) == 0 {
		t.Fatalf("status.proof: %v", err)
	}
	want := fencing.Record{
		Namespace: ns, Resource: resource, Owner: a.name, RequestID: "rec-run-1", Grant: g.Name, LeaseID: string(g.UID),
		OperationRoot: g.Spec.OperationRoot, OperationClass: "settlement", Fence: g.Status.FenceToken,
		BackendRevision: r.BackendRevision, IssuerEpoch: 0, TTLSeconds: 30, KeyID: r.KeyID,
	}
	if !reflect.DeepEqual(r, want) || r.BackendRevision == "" || r.KeyID == "" {
		t.Fatalf("record = %+v\nwant     %+v", r, want)
	}
	if g.Status.Record.FenceToken != r.Fence || g.Status.Record.LeaseID != r.LeaseID {
		t.Fatalf("status.record %+v disagrees with the proof", g.Status.Record)
	}
	bundle := trustBundle(t)
	if _, err := bundle.VerifyProof(fencing.Proof(g.Status.Proof)); err != nil {
		t.Fatalf("the published trust bundle does not verify the proof: %v", err)
	}
	// Renewing does not change the record.
	if err := renew(t, a, g); err != nil {
		t.Fatal(err)
	}
	g2 := waitFor(t, g, "renewed", func(x *lockingv1alpha1.LockGrant) bool { return x.Status.ObservedRenewals == 1 })
	if g2.Status.Proof != g.Status.Proof {
		t.Fatal("a renew changed the signed record")
	}
}

// Forged, tampered and replayed proofs are refused with their reason, and
// the object's recorded fence does not move.
func TestForgedTamperedAndReplayedProofs(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "pf-a"), as(t, "pf-b")
	g := heldWithProof(t, a, ns)
	const obj = "ledger"
	fence := fenceOf(g)
	if err := proofWrite(t, a, ns, obj, resource, g, fence, g.Status.Proof, "good"); err != nil {
		t.Fatalf("a write with a valid proof: %v", err)
	}
	unchanged := func(what string) {
		t.Helper()
		if data, f := readCM(t, ns, obj); data != "good" || f != fence {
			t.Fatalf("after %s the object is %q at fence %s, want good at %s", what, data, f, fence)
		}
	}
	rec, sig, err := fencing.ParseProof(fencing.Proof(g.Status.Proof))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("forged huge fence", func(t *testing.T) {
		huge := "9223372036854775807"
		wantReason(t, "huge fence with a real proof", proofWrite(t, a, ns, obj, resource, g, huge, g.Status.Proof, "forged"), "BINDING_MISMATCH")
		forged := rec
		forged.Fence = 1<<63 - 1
		wantReason(t, "huge fence in a record with the old signature", proofWrite(t, a, ns, obj, resource, g, huge, string(fencing.FormatProof(forged, sig)), "forged"), "BAD_SIGNATURE")
		unchanged("a forged fence")
	})

	t.Run("tampered record, every field", func(t *testing.T) {
		v := reflect.ValueOf(&rec).Elem()
		for i := range v.NumField() {
			tampered := rec
			f := reflect.ValueOf(&tampered).Elem().Field(i)
			switch f.Kind() {
			case reflect.String:
				f.SetString(f.String() + "x")
			case reflect.Int64:
				f.SetInt(f.Int() + 1)
			}
			err := proofWrite(t, a, ns, obj, resource, g, fence, string(fencing.FormatProof(tampered, sig)), "tampered")
			wantReason(t, "record with "+v.Type().Field(i).Name+" changed", err, "BAD_SIGNATURE")
		}
		wantReason(t, "garbage proof", proofWrite(t, a, ns, obj, resource, g, fence, "lgv1.not-a-proof", "tampered"), "BAD_SIGNATURE")
		unchanged("tampered records")
	})

	t.Run("replayed for another resource", func(t *testing.T) {
		other := "invoice-batch/2026-07-20"
		err := proofWrite(t, a, ns, "other-ledger", other, g, fence, g.Status.Proof, "replayed")
		wantReason(t, "proof replayed for another resource", err, "BINDING_MISMATCH")
	})

	t.Run("replayed to another object of the same resource by another owner", func(t *testing.T) {
		err := proofWrite(t, b, ns, "second-ledger", resource, g, fence, g.Status.Proof, "replayed")
		wantReason(t, "A's proof presented by B", err, "NOT_OWNER")
		err = proofWrite(t, b, ns, obj, resource, g, fence, g.Status.Proof, "replayed")
		wantReason(t, "A's proof presented by B on A's object", err, "NOT_OWNER")
		unchanged("replays")
	})
}

func trustBundle(t *testing.T) *fencing.TrustBundle {
	t.Helper()
	var b *fencing.TrustBundle
	waitUntil(t, "the trust bundle is published", func() (bool, error) {
		cm := configMap(t, managerNamespace, "lockwarden-trust-bundle")
		if cm == nil {
			return false, nil
		}
		var err error
		b, err = fencing.ParseTrustBundle([]byte(cm.Data["trust-bundle.json"]))
		return err == nil, nil
	})
	return b
}
