package integration

// This test raises the cluster-wide FenceIssuer's epoch; the file name
// sorts among the last so that it runs after the others.

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// After a reinstall, an object under a GuardPolicy has recorded fence F of
// the issuer's current epoch, and its resource's FenceCounter is gone. Once
// the manager's scan has found F, the next request is never granted a
// fence at or below F (the counter alone would give epoch<<40|1): it waits
// as Pending with reason FenceRegression, naming the object and the epoch
// to raise to, with a Warning Event on the grant and on the FenceIssuer.
// After the administrator raises the epoch as the condition says, it is
// granted the first fence of that epoch, above F, and its write to the
// object is accepted.
func TestZZGrantNeverIssuedAtOrBelowARecordedFence(t *testing.T) {
	ns := namespace(t)
	const name = "ledger-floor"
	policy := "floor-" + ns
	res := "settlement/" + ns + "/" + name
	epoch := issuerEpoch(t)
	recorded := epoch<<fencing.EpochBits | 5
	earlierLife(t, ns, name, res, policy, recorded)
	newPolicy(t, policy, ns, lockingv1alpha1.ModeEnforce, "floor-a")
	enforced(t, ns, name)

	waitUntil(t, "the manager's scan finds the recorded fence", func() (bool, error) {
		f, err := env.Floors.Scan(t.Context())
		if err != nil {
			return false, err
		}
		return f.For(ns, res)[res].Fence == recorded, nil
	})

	a := as(t, "floor-a")
	g, err := acquire(t, a, ns, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource, g.Spec.Policy = res, policy })
	if err != nil {
		t.Fatal(err)
	}
	next := fencing.FormatFence(epoch + 1)
	g = waitHeldBack(t, g, "FenceRegression", "spec.epoch to "+next+" or more")
	if c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady); !strings.Contains(c.Message, "ConfigMap "+ns+"/"+name) ||
		!strings.Contains(c.Message, fencing.FormatFence(recorded)) {
		t.Fatalf("Ready %q names neither the object nor its fence", c.Message)
	}
	waitEvent(t, ns, "LockGrant", g.Name, "FenceRegression", "ConfigMap "+ns+"/"+name)
	waitEvent(t, metav1.NamespaceDefault, "FenceIssuer", lockingv1alpha1.DefaultFenceIssuerName, "FenceRegression", g.Name)
	c := &lockingv1alpha1.FenceCounter{}
	if err := admin.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(res)}, c); !apierrors.IsNotFound(err) {
		t.Fatalf("the counter of %s while held back: %+v, %v; want none written", res, c.Spec, err)
	}

	updateIssuer(t, func(iss *lockingv1alpha1.FenceIssuer) {
		iss.Spec.Epoch = epoch + 1
		for e := range epoch + 1 {
			if !slices.Contains(iss.Spec.RevokedEpochs, e) {
				iss.Spec.RevokedEpochs = append(iss.Spec.RevokedEpochs, e)
			}
		}
	})
	g = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
	if f := g.Status.FenceToken; f <= recorded || fencing.EpochOf(f) != epoch+1 || fencing.SequenceOf(f) != 1 {
		t.Fatalf("granted fence %d (epoch %d, sequence %d); want the first fence of epoch %d, above %d", f, fencing.EpochOf(f), fencing.SequenceOf(f), epoch+1, recorded)
	}
	if err := writeCM(t, a, ns, name, "after the epoch was raised", map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}, nil); err != nil {
		t.Fatalf("the holder's write above the recorded fence: %v", err)
	}
	if data, fence := readCM(t, ns, name); data != "after the epoch was raised" || fence != fenceOf(g) {
		t.Fatalf("object = %q at fence %s", data, fence)
	}
}

// A floor whose object is gone holds nothing back: the manager reads the
// object again before it holds a request back for it. Here the object
// that recorded F under a policy is retired (the policy deleted, then the
// object) after the scan found F; the next request for its resource is
// granted the issuer epoch's first fence, below F, at once.
func TestZZFloorOfADeletedObjectHoldsNothingBack(t *testing.T) {
	ns := namespace(t)
	const name = "ledger-gone"
	policy := "floor-gone-" + ns
	res := "settlement/" + ns + "/" + name
	epoch := issuerEpoch(t)
	recorded := epoch<<fencing.EpochBits | 5
	earlierLife(t, ns, name, res, policy, recorded)
	p := newPolicy(t, policy, ns, lockingv1alpha1.ModeEnforce, "floor-b")
	waitUntil(t, "the manager's scan finds the recorded fence", func() (bool, error) {
		f, err := env.Floors.Scan(t.Context())
		if err != nil {
			return false, err
		}
		return f.For(ns, res)[res].Fence == recorded, nil
	})

	if err := admin.Delete(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the retired object is deleted", func() (bool, error) {
		err := admin.Delete(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
		return err == nil || apierrors.IsNotFound(err), nil
	})

	g, err := acquire(t, as(t, "floor-b"), ns, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = res })
	if err != nil {
		t.Fatal(err)
	}
	g = waitFor(t, g, "Held, or held back", func(g *lockingv1alpha1.LockGrant) bool {
		c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady)
		return g.Status.Phase == lockingv1alpha1.PhaseHeld || c != nil && c.Reason == lockingv1alpha1.LockGrantReasonFenceRegression
	})
	if g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.FenceToken != epoch<<fencing.EpochBits|1 {
		t.Fatalf("grant %s: phase %s, fence %d, conditions %+v; want Held with fence %d", g.Name, g.Status.Phase, g.Status.FenceToken, g.Status.Conditions, epoch<<fencing.EpochBits|1)
	}
	if got := env.Floors.Floors(ns, res); got[res].Fence != 0 {
		t.Fatalf("the deleted object's floor is still in force: %+v", got)
	}
}
