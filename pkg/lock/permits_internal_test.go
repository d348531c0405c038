package lock

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

func TestWithPermitsRange(t *testing.T) {
	for _, n := range []int32{1, 2, 16, lockingv1alpha1.MaxPermits} {
		if s := newSettings([]Option{WithPermits(n)}); s.err != nil || s.permits != n {
			t.Errorf("WithPermits(%d): permits %d, %v", n, s.permits, s.err)
		}
	}
	for _, n := range []int32{-1, 0, lockingv1alpha1.MaxPermits + 1} {
		if s := newSettings([]Option{WithPermits(n)}); !errors.Is(s.err, ErrInvalidOption) {
			t.Errorf("WithPermits(%d): %v, want ErrInvalidOption", n, s.err)
		}
	}
}

// grantFixture is a grant of resource as the registry shows it Held in
// slot permit (nil: a registry that writes no slot), with fenced as its
// fenced resource and recordResource in its signed record ("": no record).
func grantFixture(resource string, permit *int32, fenced, recordResource string) *lockingv1alpha1.LockGrant {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "req-1", UID: "uid-1"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: 30, RequestID: "1"},
		Status: lockingv1alpha1.LockGrantStatus{Phase: lockingv1alpha1.PhaseHeld, FenceToken: 7,
			Permit: permit, FencedResource: fenced},
	}
	if recordResource != "" {
		g.Status.Record = &lockingv1alpha1.GrantRecord{Schema: "lockGrant.v1", Resource: recordResource}
	}
	return g
}

// createdHandle is a handle that created g and read it Pending, without a
// registry (following its resource's counter when counter is set).
func createdHandle(t *testing.T, g *lockingv1alpha1.LockGrant, counter bool) *Handle {
	t.Helper()
	clk := clocktesting.NewFakeClock(metav1.Now().Time)
	h := &Handle{clk: clk, origin: clk.Now(), log: logr.Discard(), resource: g.Spec.Resource, counter: counter,
		key: types.NamespacedName{Namespace: g.Namespace, Name: g.Name}, changed: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancelCause(t.Context())
	pending := g.DeepCopy()
	pending.Status = lockingv1alpha1.LockGrantStatus{Phase: lockingv1alpha1.PhasePending}
	if err := h.adopt(pending, newSettings(nil)); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.m.Created(0)
	h.mu.Unlock()
	return h
}

// heldHandle is a handle that created g and then read it Held, without a
// registry: what Acquire has when it returns.
func heldHandle(t *testing.T, g *lockingv1alpha1.LockGrant) *Handle {
	t.Helper()
	h := createdHandle(t, g, false)
	h.mu.Lock()
	h.observe(h.mono(), g)
	h.mu.Unlock()
	if st := h.State(); st != holder.Held {
		t.Fatalf("fixture handle is %s, want HELD", st)
	}
	return h
}

// A handle of a slot writes under the slot's fenced resource ID: Stamp
// binds objects to it, segments name it, and an object bound to another
// slot or to the resource's slot 0 is refused before anything is sent.
func TestHandleWritesUnderItsSlot(t *testing.T) {
	const res = "batch/nightly"
	for _, tc := range []struct {
		name       string
		g          *lockingv1alpha1.LockGrant
		wantPermit int32
		wantFenced string
	}{
		{"exclusive, registry without slots", grantFixture(res, nil, "", res), 0, res},
		{"slot 0", grantFixture(res, ptr.To[int32](0), res, res), 0, res},
		{"slot 2", grantFixture(res, ptr.To[int32](2), res+"#2", res+"#2"), 2, res + "#2"},
		{"slot 2, no record published", grantFixture(res, ptr.To[int32](2), res+"#2", ""), 2, res + "#2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := heldHandle(t, tc.g)
			if h.Info().Permit != tc.wantPermit || h.Info().FencedResource != tc.wantFenced || h.Info().Resource != res {
				t.Fatalf("permit %d, fenced resource %q, resource %q; want %d, %q, %q", h.Info().Permit, h.Info().FencedResource, h.Info().Resource, tc.wantPermit, tc.wantFenced, res)
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "out"}}
			if err := h.Stamp(cm); err != nil {
				t.Fatal(err)
			}
			if got := cm.Annotations[lockingv1alpha1.ResourceAnnotation]; got != tc.wantFenced {
				t.Errorf("stamped resource %q, want %q", got, tc.wantFenced)
			}
			if got := cm.Annotations[lockingv1alpha1.FenceAnnotation]; got != "7" {
				t.Errorf("stamped fence %q, want 7", got)
			}
			// Stamping again (a retry) keeps the binding.
			if err := h.Stamp(cm); err != nil {
				t.Errorf("restamping an object bound to the handle's slot: %v", err)
			}
			seg, err := h.NextSegment()
			if err != nil || seg.Resource != tc.wantFenced || seg.Fence != 7 || seg.Seq != 1 {
				t.Errorf("segment %+v, %v; want resource %q, fence 7, seq 1", seg, err, tc.wantFenced)
			}
			for _, other := range []string{"batch/other", res + "#1", res + "#2", res} {
				if other == tc.wantFenced {
					continue
				}
				obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "x",
					Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: other}}}
				if err := h.Stamp(obj); !errors.Is(err, fencing.ErrBindingMismatch) {
					t.Errorf("stamping an object bound to %q: %v, want BINDING_MISMATCH", other, err)
				}
				if obj.Annotations[lockingv1alpha1.FenceAnnotation] != "" || obj.Labels != nil {
					t.Errorf("a refused stamp changed the object: %v %v", obj.Labels, obj.Annotations)
				}
			}
		})
	}
}

// A signed record that names another slot than the grant's status is
// refused locally: every verifier would refuse the write.
func TestStampRefusesARecordOfAnotherSlot(t *testing.T) {
	const res = "batch/nightly"
	h := heldHandle(t, grantFixture(res, ptr.To[int32](1), res+"#1", res))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "out"}}
	if err := h.Stamp(cm); !errors.Is(err, fencing.ErrBindingMismatch) {
		t.Fatalf("Stamp with a record of slot 0 and a status of slot 1: %v, want BINDING_MISMATCH", err)
	}
	if len(cm.Annotations) != 0 {
		t.Errorf("a refused stamp changed the object: %v", cm.Annotations)
	}
	if _, err := h.NextSegment(); !errors.Is(err, fencing.ErrBindingMismatch) {
		t.Errorf("NextSegment: %v, want BINDING_MISMATCH", err)
	}
}

// The slot is fixed by the read that first showed the grant Held.
func TestSlotIsFixedOnceHeld(t *testing.T) {
	const res = "batch/nightly"
	h := heldHandle(t, grantFixture(res, ptr.To[int32](1), res+"#1", res+"#1"))
	later := grantFixture(res, ptr.To[int32](2), res+"#2", res+"#1")
	h.mu.Lock()
	h.observe(h.mono(), later)
	h.mu.Unlock()
	if h.Info().Permit != 1 || h.Info().FencedResource != res+"#1" {
		t.Fatalf("after a later read: permit %d, fenced resource %q; want 1, %q", h.Info().Permit, h.Info().FencedResource, res+"#1")
	}
}
