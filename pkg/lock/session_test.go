package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// A Client ties its requests to its own session, held by its own identity.
// When the session is lost (here its Lease is deleted), the handle closes
// Done at once and the registry ends the grant; Close deletes the Lease.
func TestAcquireUnderTheClientsSession(t *testing.T) {
	ns := namespace(t)
	if err := env.GrantUsersSessions(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	locks := newTestClient(t, as(t, "sess-a"), lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), "ledger/sessions")
	if err != nil {
		t.Fatal(err)
	}
	g := grantOf(t, h.Grant())
	if g.Spec.Session == nil {
		t.Fatal("the request names no session")
	}
	l := &coordinationv1.Lease{}
	if err := admin.Get(t.Context(), keyIn(ns, g.Spec.Session.Name), l); err != nil {
		t.Fatal(err)
	}
	if string(l.UID) != g.Spec.Session.UID || *l.Spec.HolderIdentity != g.Spec.Owner || l.Labels[lockingv1alpha1.SessionLabel] != "true" {
		t.Fatalf("session Lease %+v does not match the request's %+v (owner %s)", l.Spec, g.Spec.Session, g.Spec.Owner)
	}

	// A second request of the same Client shares the session.
	h2, err := locks.Acquire(t.Context(), "ledger/sessions-2")
	if err != nil {
		t.Fatal(err)
	}
	if s2 := grantOf(t, h2.Grant()).Spec.Session; s2 == nil || *s2 != *g.Spec.Session {
		t.Fatalf("second request's session %+v, want %+v", s2, g.Spec.Session)
	}
	if err := h2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	if err := admin.Delete(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the handle is spent", func() bool { return closed(h.Done()) })
	// Whichever comes first: the registry's end or the keeper's failed renewal.
	if err := h.Err(); !errors.Is(err, lock.ErrSessionExpired) && !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err = %v, want ErrSessionExpired or ErrLost", err)
	}
	ended := waitPhase(t, h.Grant(), lockingv1alpha1.PhaseExpired)
	if ended.Status.FenceToken != h.Fence() {
		t.Fatalf("the ended grant's fence changed from %d to %d", h.Fence(), ended.Status.FenceToken)
	}

	// The next Acquire makes a new session; Close deletes it.
	h3, err := locks.Acquire(t.Context(), "ledger/sessions-3")
	if err != nil {
		t.Fatal(err)
	}
	s3 := grantOf(t, h3.Grant()).Spec.Session
	if s3 == nil || s3.UID == g.Spec.Session.UID {
		t.Fatalf("after the loss the request names session %+v, want a new one", s3)
	}
	if err := h3.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := locks.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := admin.Get(t.Context(), keyIn(ns, s3.Name), &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the session Lease after Close: %v, want NotFound", err)
	}
}

// noRenew loses every renewal of a session Lease.
type noRenew struct{ client.WithWatch }

func (n noRenew) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if _, ok := obj.(*coordinationv1.Lease); ok {
		return errLostReply
	}
	return n.WithWatch.Patch(ctx, obj, patch, opts...)
}

// A session whose renewals do not get through ends at its local deadline
// (TTL minus its margin after the last confirmed renewal was sent), on the
// client's monotonic clock: before the registry can count it lapsed.
func TestSessionEndsAtItsLocalDeadline(t *testing.T) {
	ns := namespace(t)
	if err := env.GrantUsersSessions(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := lock.NewSession(t.Context(), noRenew{as(t, "sess-b")}, ns, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(t.Context()) //nolint:errcheck // test cleanup
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session never ended")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the session ended %s after it was created, after its 2 s TTL", took)
	}
	if !errors.Is(s.Err(), lock.ErrSessionExpired) {
		t.Fatalf("Err = %v, want ErrSessionExpired", s.Err())
	}
}

// Without the right to keep Leases, requests are made without a session,
// as before sessions existed.
func TestAcquireWithoutLeaseRightsHasNoSession(t *testing.T) {
	ns := namespace(t)
	h, err := newTestClient(t, as(t, "sess-none"), lock.WithNamespace(ns)).Acquire(t.Context(), "ledger/no-session")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(t.Context()) //nolint:errcheck // test cleanup
	if s := grantOf(t, h.Grant()).Spec.Session; s != nil {
		t.Fatalf("the request names session %+v, want none", s)
	}
}

func keyIn(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}
