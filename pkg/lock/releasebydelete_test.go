package lock_test

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// A holder that releases by delete leaves nothing behind: its grant is
// gone, the counter no longer names it when Release returns (a write under
// it is refused), and the next waiter holds at once with the next fence.
func TestReleaseByDelete(t *testing.T) {
	ns := namespace(t)
	ca, cb := as(t, "bydelete-a"), as(t, "bydelete-b")
	const res = "invoice-batch/by-delete"
	a, err := newTestClient(t, ca, lock.WithNamespace(ns), lock.WithReleaseByDelete()).Acquire(t.Context(), res, lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AwaitRecord(t.Context()); err != nil {
		t.Fatal(err)
	}
	type acquisition struct {
		h   *lock.Handle
		err error
	}
	acquired := make(chan acquisition, 1)
	locksB := newTestClient(t, cb, lock.WithNamespace(ns))
	go func() {
		b, err := locksB.Acquire(t.Context(), res, lock.WithTTL(30*time.Second))
		acquired <- acquisition{b, err}
	}()
	eventually(t, "B waits in line", func() bool {
		var list lockingv1alpha1.LockGrantList
		return admin.List(t.Context(), &list) == nil && countPhase(list.Items, ns, lockingv1alpha1.PhasePending) == 1
	})
	release(t, a, "")
	if err := admin.Get(t.Context(), a.Info().Grant, &lockingv1alpha1.LockGrant{}); !apierrors.IsNotFound(err) {
		t.Fatalf("A's grant after its release by delete: %v, want NotFound", err)
	}
	fc := &lockingv1alpha1.FenceCounter{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(res)}, fc); err != nil {
		t.Fatal(err)
	}
	if h := fc.Spec.Holder; h != nil && h.UID == string(a.Info().UID) {
		t.Fatalf("Release returned while the counter still names A")
	}
	// A write that still claims A's grant is refused.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "after-release",
		Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"},
		Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: res, lockingv1alpha1.GrantAnnotation: ns + "/" + a.Info().Grant.Name,
			lockingv1alpha1.FenceAnnotation: "1"}}}
	if err := ca.Create(t.Context(), cm); lock.Refusal(err) == nil {
		t.Fatalf("a write under A's deleted grant: %v, want a refusal", err)
	}
	got := <-acquired
	if got.err != nil {
		t.Fatal(got.err)
	}
	b := got.h
	if b.Info().Fence != 2 {
		t.Fatalf("B's fence = %d, want 2", b.Info().Fence)
	}
	release(t, b, "")
}

// A grant that already ended is not deleted by a release by delete: the
// release is refused with the reason the grant ended, as a release is.
func TestReleaseByDeleteOfEndedGrant(t *testing.T) {
	ns := namespace(t)
	hclk := newHandleClock()
	locks := newTestClient(t, as(t, "bydelete-ended"), lock.WithNamespace(ns), lock.WithReleaseByDelete(), lock.WithClock(hclk))
	a, err := locks.Acquire(t.Context(), "invoice-batch/by-delete-ended", lock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AwaitRecord(t.Context()); err != nil {
		t.Fatal(err)
	}
	clk.Step(3 * time.Second)
	hclk.Step(3 * time.Second)
	wake(t, a.Info().Grant)
	waitPhase(t, a.Info().Grant, lockingv1alpha1.PhaseExpired)
	eventually(t, "A read that its grant expired", func() bool { return closed(a.Context().Done()) })
	release(t, a, fencing.ReasonExpired)
	if g := grantOf(t, a.Info().Grant); g.Status.Phase != lockingv1alpha1.PhaseExpired {
		t.Fatalf("A's grant after the refused release: %s, want it kept, Expired", g.Status.Phase)
	}
}

// Release by delete gives up the lock-delay and the request ID's spent
// window, so it is refused together with either.
func TestReleaseByDeleteRefusedOptions(t *testing.T) {
	locks := newTestClient(t, as(t, "bydelete-options"), lock.WithNamespace(namespace(t)), lock.WithReleaseByDelete())
	for name, opt := range map[string]lock.Option{"lock-delay": lock.WithLockDelay(time.Second), "request ID": lock.WithRequestID("run-7")} {
		if _, err := locks.Acquire(t.Context(), "invoice-batch/by-delete-options", opt); !errors.Is(err, lock.ErrInvalidOption) {
			t.Errorf("with a %s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// countPhase counts the grants of ns in phase p.
func countPhase(gs []lockingv1alpha1.LockGrant, ns string, p lockingv1alpha1.LockGrantPhase) int {
	n := 0
	for i := range gs {
		if gs[i].Namespace == ns && gs[i].Status.Phase == p {
			n++
		}
	}
	return n
}

// A detached grant acquired with a lock-delay is not released by deleting
// it: Client.Release with WithReleaseByDelete refuses and leaves the grant,
// which a plain Release then releases.
func TestReleaseByDeleteKeepsLockDelayedGrant(t *testing.T) {
	ns := namespace(t)
	locks := newTestClient(t, as(t, "bydelete-detached"), lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), "invoice-batch/by-delete-detached", lock.WithTTL(30*time.Second), lock.WithLockDelay(time.Second), lock.WithDetachedGrant())
	if err != nil {
		t.Fatal(err)
	}
	if err := locks.Release(t.Context(), h.Info().Grant, h.Info().UID, lock.WithReleaseByDelete()); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("release by delete of a grant with a lock-delay: %v, want ErrInvalidOption", err)
	}
	if g := waitPhase(t, h.Info().Grant, lockingv1alpha1.PhaseHeld); g.Spec.Release {
		t.Fatal("the grant after the refused release by delete asks to be released, want it kept Held")
	}
	if err := locks.Release(t.Context(), h.Info().Grant, h.Info().UID); err != nil {
		t.Fatal(err)
	}
}
