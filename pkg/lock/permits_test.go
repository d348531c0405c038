package lock_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// Two holders of a resource with 2 permits hold at once, in distinct
// permits with a fence sequence each; a third is busy. Each writes under
// its own permit's fenced resource ID, and the permit a holder releases goes
// to the next with that permit's next fence, which the permit's guarded
// object accepts.
func TestAcquirePermits(t *testing.T) {
	ns := namespace(t)
	const res = "farm/render"
	ca, cb, cc := as(t, "permit-a"), as(t, "permit-b"), as(t, "permit-c")
	a, err := newTestClient(t, ca, lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	b, err := newTestClient(t, cb, lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if a.Info().Permit == b.Info().Permit || a.Info().Fence != 1 || b.Info().Fence != 1 {
		t.Fatalf("two holders: permits %d and %d, fences %d and %d; want distinct permits, fence 1 each", a.Info().Permit, b.Info().Permit, a.Info().Fence, b.Info().Fence)
	}
	for _, h := range []*lock.Handle{a, b} {
		g := grantOf(t, h.Info().Grant)
		if want := lockingv1alpha1.SlotResource(res, h.Info().Permit); h.Info().FencedResource != want || g.Status.FencedResource != want || g.Spec.Permits != 2 || h.Info().Resource != res {
			t.Fatalf("permit %d: fenced resource %q (status %q), spec.permits %d; want %q, 2", h.Info().Permit, h.Info().FencedResource, g.Status.FencedResource, g.Spec.Permits, want)
		}
		if rec := h.Record(); rec == nil || rec.Resource != h.Info().FencedResource {
			t.Fatalf("permit %d: signed record %+v does not name %q", h.Info().Permit, rec, h.Info().FencedResource)
		}
	}
	c := newTestClient(t, cc, lock.WithNamespace(ns))
	if _, err := c.TryAcquire(t.Context(), res, lock.WithPermits(2)); !errors.Is(err, lock.ErrBusy) {
		t.Fatalf("TryAcquire with both permits held: %v, want ErrBusy", err)
	}

	// b's guarded object is bound to b's permit.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "frame"}, Data: map[string]string{"by": "b"}}
	if err := b.Stamp(cm); err != nil {
		t.Fatal(err)
	}
	if err := cb.Create(b.Context(), cm); err != nil {
		t.Fatalf("guarded create under permit %d: %v", b.Info().Permit, err)
	}
	if got := cm.Annotations[lockingv1alpha1.ResourceAnnotation]; got != b.Info().FencedResource {
		t.Fatalf("the object is bound to %q, want %q", got, b.Info().FencedResource)
	}
	// The holder of the other permit cannot write it, not even with a
	// claim put on by hand: fence 1 of another fence sequence.
	forged := cm.DeepCopy()
	forged.Data["by"] = "a"
	forged.Annotations[lockingv1alpha1.GrantAnnotation] = ns + "/" + a.Info().Grant.Name
	forged.Annotations[lockingv1alpha1.FenceAnnotation] = "1"
	forged.Annotations[lockingv1alpha1.ProofAnnotation] = a.Proof()
	forged.Annotations[lockingv1alpha1.WriteIDAnnotation] = "forged-write-id-0123456789"
	if err := ca.Update(t.Context(), forged); lock.Refusal(err) == nil {
		t.Fatalf("a write by the holder of permit %d to an object of permit %d: %v, want a fencing refusal", a.Info().Permit, b.Info().Permit, err)
	}
	if err := a.Stamp(cm.DeepCopy()); !errors.Is(err, fencing.ErrBindingMismatch) {
		t.Fatalf("stamping permit %d's object under permit %d: %v, want BINDING_MISMATCH", b.Info().Permit, a.Info().Permit, err)
	}

	release(t, b, "")
	hc, err := c.Acquire(t.Context(), res, lock.WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	if hc.Info().Permit != b.Info().Permit || hc.Info().FencedResource != b.Info().FencedResource || hc.Info().Fence != 2 {
		t.Fatalf("after permit %d was released: permit %d (%s), fence %d; want permit %d, fence 2", b.Info().Permit, hc.Info().Permit, hc.Info().FencedResource, hc.Info().Fence, b.Info().Permit)
	}
	cur := &corev1.ConfigMap{}
	if err := cc.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "frame"}, cur); err != nil {
		t.Fatal(err)
	}
	cur.Data["by"] = "c"
	if err := hc.Stamp(cur); err != nil {
		t.Fatal(err)
	}
	if err := cc.Update(hc.Context(), cur); err != nil {
		t.Fatalf("the permit's next holder writes its object: %v", err)
	}
	if cur.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != "2" {
		t.Fatalf("accepted fence %q, want 2", cur.Annotations[lockingv1alpha1.AcceptedFenceAnnotation])
	}
	release(t, hc, "")
	release(t, a, "")
}

// Without WithPermits the request is an exclusive lock, as before permits
// existed: no spec.permits, slot 0, the resource itself. A request ID is
// one request: asking again under it with other permits is a conflict.
func TestExclusiveRequestAndPermitsConflict(t *testing.T) {
	ns := namespace(t)
	locks := newTestClient(t, as(t, "permit-x"), lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), "farm/exclusive", lock.WithRequestID("x-1"))
	if err != nil {
		t.Fatal(err)
	}
	if g := grantOf(t, h.Info().Grant); g.Spec.Permits != 0 || h.Info().Permit != 0 || h.Info().FencedResource != "farm/exclusive" {
		t.Fatalf("exclusive request: spec.permits %d, permit %d, fenced resource %q", g.Spec.Permits, h.Info().Permit, h.Info().FencedResource)
	}
	if _, err := locks.Acquire(t.Context(), "farm/exclusive", lock.WithRequestID("x-1"), lock.WithPermits(3)); !errors.Is(err, lock.ErrRequestIDConflict) {
		t.Fatalf("the same request ID with 3 permits: %v, want ErrRequestIDConflict", err)
	}
	if _, err := locks.Acquire(t.Context(), "farm/exclusive", lock.WithPermits(65)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("65 permits: %v, want ErrInvalidOption", err)
	}
	release(t, h, "")
}
