package integration

import (
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The owner's renew and release are judged by the admission policy in the
// API server, without a webhook call. If an administrator deletes the
// policy's binding, the identity rules still hold: the webhook judges
// every update but the owner's own renew or release, so another identity
// can neither release nor renew nor relabel the grant. The owner's own
// updates are then judged by the CRD's rules and the controller: a renew
// of a request still in the queue changes nothing, and a release still
// releases.
func TestUpdatesWithoutThePolicyBinding(t *testing.T) {
	ns := namespace(t)
	a, b := as(t, "binding-a"), as(t, "binding-b")
	held := mustAcquire(t, a, ns, 60)
	queued, err := acquire(t, a, ns, 60)
	if err != nil {
		t.Fatal(err)
	}
	queued = waitPhase(t, queued, lockingv1alpha1.PhasePending)
	wantReason(t, "the owner renewing its queued request, with the binding", renew(t, a, queued), "NOT_HELD")

	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	if err := admin.Get(t.Context(), client.ObjectKey{Name: "lockgrant-updates"}, binding); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(t.Context(), binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		restored := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: binding.Name}, Spec: binding.Spec}
		if err := admin.Create(ctx, restored); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Errorf("restoring the binding: %v", err)
		}
		// A request withdrawn at birth: only the policy refuses its owner's
		// renew (ALREADY_ENDED).
		withdrawn := &lockingv1alpha1.LockGrant{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "withdrawn-"},
			Spec:       lockingv1alpha1.LockGrantSpec{Resource: "policy-probe", LeaseDurationSeconds: 60, Release: true},
		}
		if err := a.c.Create(ctx, withdrawn); err != nil {
			t.Errorf("creating a probe request: %v", err)
			return
		}
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return reason(renewDryRun(ctx, a, withdrawn)) == "ALREADY_ENDED", nil
		}); err != nil {
			t.Errorf("the policy was not enforced again after its binding was restored: %v", err)
		}
	})
	waitUntil(t, "the policy no longer enforced", func() (bool, error) {
		return renewDryRun(t.Context(), a, queued) == nil, nil
	})

	wantReason(t, "another identity releasing the grant", release(t, b, held), "NOT_OWNER")
	wantReason(t, "another identity renewing the grant", renew(t, b, held), "NOT_OWNER")
	wantReason(t, "another identity labeling the grant", annotateAs(t, b, held, "team", "b"), "NOT_OWNER")
	wantReason(t, "the owner changing its request time", annotateAs(t, a, held, lockingv1alpha1.RequestedAtAnnotation, "2020-01-01T00:00:00Z"), "INVALID_SPEC")

	if err := renew(t, a, queued); err != nil {
		t.Fatalf("the owner renewing its queued request without the binding: %v", err)
	}
	if g := get(t, queued); g.Status.Phase != lockingv1alpha1.PhasePending || g.Status.FenceToken != 0 {
		t.Fatalf("the queued request after its renew: %+v, want Pending without a fence", g.Status)
	}
	if err := release(t, a, held); err != nil {
		t.Fatalf("the owner releasing without the binding: %v", err)
	}
	waitPhase(t, held, lockingv1alpha1.PhaseReleased)
	if g := waitPhase(t, queued, lockingv1alpha1.PhaseHeld); g.Status.FenceToken != 2 {
		t.Fatalf("the next request's fence = %d, want 2", g.Status.FenceToken)
	}
}

// renewDryRun sends the owner's renew of g as a dry run.
func renewDryRun(ctx context.Context, a *actor, g *lockingv1alpha1.LockGrant) error {
	cur := &lockingv1alpha1.LockGrant{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
		return err
	}
	next := cur.DeepCopy()
	next.Spec.Renewals++
	return a.c.Patch(ctx, next, client.MergeFrom(cur), client.DryRunAll)
}

// annotateAs sets annotation key of g to value, as a.
func annotateAs(t *testing.T, a *actor, g *lockingv1alpha1.LockGrant, key, value string) error {
	t.Helper()
	cur := get(t, g)
	next := cur.DeepCopy()
	metav1.SetMetaDataAnnotation(&next.ObjectMeta, key, value)
	return a.c.Patch(t.Context(), next, client.MergeFrom(cur))
}
