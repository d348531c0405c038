package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
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
// When the session is lost (here its Lease is deleted), the handle ends its
// Context at once and the registry ends the grant; Close deletes the Lease.
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
	g := grantOf(t, h.Info().Grant)
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
	if s2 := grantOf(t, h2.Info().Grant).Spec.Session; s2 == nil || *s2 != *g.Spec.Session {
		t.Fatalf("second request's session %+v, want %+v", s2, g.Spec.Session)
	}
	if err := h2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	if err := admin.Delete(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the handle is spent", func() bool { return closed(h.Context().Done()) })
	// Whichever comes first: the registry's end or the keeper's failed renewal.
	if err := context.Cause(h.Context()); !errors.Is(err, lock.ErrSessionExpired) && !errors.Is(err, lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrSessionExpired or ErrLost", err)
	}
	ended := waitPhase(t, h.Info().Grant, lockingv1alpha1.PhaseExpired)
	if ended.Status.FenceToken != h.Info().Fence {
		t.Fatalf("the ended grant's fence changed from %d to %d", h.Info().Fence, ended.Status.FenceToken)
	}

	// The next Acquire makes a new session; Close deletes it.
	h3, err := locks.Acquire(t.Context(), "ledger/sessions-3")
	if err != nil {
		t.Fatal(err)
	}
	s3 := grantOf(t, h3.Info().Grant).Spec.Session
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
		t.Fatalf("cause = %v, want ErrSessionExpired", s.Err())
	}
}

// cutLeases loses every renewal of a session Lease once cut is set, as a
// network partition between the client and the API server would.
type cutLeases struct {
	client.WithWatch
	cut *atomic.Bool
}

func (c cutLeases) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if _, ok := obj.(*coordinationv1.Lease); ok && c.cut.Load() {
		return errLostReply
	}
	return c.WithWatch.Patch(ctx, obj, patch, opts...)
}

// A holder that bounds its work by the time Check leaves (a statement
// timeout) is done before the registry ends its grant, also when the grant
// ends because the holder's session lapsed: with a 30 s lease and the
// default 5 s session whose renewals do not get through, Check counts to
// the session's local deadline (4.5 s after its last confirmed renewal was sent), not to
// the lease's 27 s, and the registry ends the grant 6 s after it last saw
// the session renewed. Both clocks are fake and step together.
func TestCheckEndsBeforeTheSessionLapses(t *testing.T) {
	ns := namespace(t)
	if err := env.GrantUsersSessions(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	hclk := newHandleClock()
	cut := &atomic.Bool{}
	cut.Store(true)
	locks := newTestClient(t, cutLeases{as(t, "sess-remaining"), cut}, lock.WithNamespace(ns), lock.WithClock(hclk), lock.WithTTL(30*time.Second))
	h, err := locks.Acquire(t.Context(), "ledger/session-remaining")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background()) //nolint:errcheck // test cleanup
	if left := remaining(h); left != 4500*time.Millisecond {
		t.Errorf("Check leaves %s right after Acquire, want the session's 4.5 s", left)
	}

	// The latest instant, by the registry's clock, until which the holder
	// believed it could work.
	var bound time.Time
	var ended *lockingv1alpha1.LockGrant
	for range 60 {
		if left := remaining(h); left > 0 && clk.Now().Add(left).After(bound) {
			bound = clk.Now().Add(left)
		}
		clk.Step(250 * time.Millisecond)
		hclk.Step(250 * time.Millisecond)
		wake(t, h.Info().Grant)
		if g := grantOf(t, h.Info().Grant); g.Status.Phase.Final() {
			ended = g
			break
		}
	}
	if ended == nil || ended.Status.EndedAt == nil {
		t.Fatal("the registry never ended the grant of a session that is not renewed")
	}
	t.Logf("the holder counted on the grant until %s, the registry ended it at %s (%s)", bound.Format(time.RFC3339Nano), ended.Status.EndedAt.Format(time.RFC3339Nano), ended.Status.Phase)
	if !bound.Before(ended.Status.EndedAt.Time) {
		t.Errorf("Check let the holder work until %s, after the registry ended the grant at %s", bound.Format(time.RFC3339Nano), ended.Status.EndedAt.Format(time.RFC3339Nano))
	}
	if err := context.Cause(h.Context()); !errors.Is(err, lock.ErrOwnershipUnknown) || !errors.Is(err, lock.ErrSessionExpired) {
		t.Errorf("cause = %v, want ErrOwnershipUnknown and ErrSessionExpired", err)
	}
}

// A handle with a stop grace (kubectl lockwarden run's --grace) waits in the
// queue under the default 5 s session, so that its client, if it died
// there, would be skipped 6 s later; once it holds, its session is
// lengthened to leave room for the grace (13 s for 3 s). Cut off from the
// API server, its Context ends at least the grace before the registry ends
// the grant for the lapsed session: work that stops within the grace of
// its end (SIGTERM, then SIGKILL) has stopped before the next waiter is
// granted. Both clocks are fake and step together.
func TestStopGraceComesOutOfTheSession(t *testing.T) {
	ns := namespace(t)
	if err := env.GrantUsersSessions(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	const res, grace = "ledger/grace", 3 * time.Second
	first, err := newTestClient(t, as(t, "sess-grace-a"), lock.WithNamespace(ns), lock.WithoutSession()).Acquire(t.Context(), res)
	if err != nil {
		t.Fatal(err)
	}
	hclk := newHandleClock()
	cut := &atomic.Bool{}
	locks := newTestClient(t, cutLeases{as(t, "sess-grace-b"), cut}, lock.WithNamespace(ns), lock.WithClock(hclk), lock.WithTTL(30*time.Second))
	type result struct {
		h   *lock.Handle
		err error
	}
	acquired := make(chan result, 1)
	go func() {
		h, err := locks.Acquire(t.Context(), res, lock.WithStopGrace(grace), lock.WithRequestID("grace-b"))
		acquired <- result{h, err}
	}()
	w := waitPhase(t, keyOf(ns, "grace-b"), lockingv1alpha1.PhasePending)
	if d := sessionTTL(t, ns, w.Spec.Session.Name); d != lock.DefaultSessionTTL {
		t.Errorf("the waiting request's session lasts %s, want the default %s", d, lock.DefaultSessionTTL)
	}

	if err := first.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := <-acquired
	if r.err != nil {
		t.Fatal(r.err)
	}
	h := r.h
	defer h.Release(context.Background()) //nolint:errcheck // test cleanup
	if d := sessionTTL(t, ns, w.Spec.Session.Name); d != 13*time.Second {
		t.Errorf("the holder's session lasts %s, want 13 s for a %s grace", d, grace)
	}
	// 13 s - 1.3 s - 3 s after the lengthening renewal was sent.
	if left := remaining(h); left != 8700*time.Millisecond {
		t.Errorf("Check leaves %s, want 8.7 s", left)
	}

	next := make(chan result, 1)
	go func() {
		h, err := newTestClient(t, as(t, "sess-grace-c"), lock.WithNamespace(ns), lock.WithoutSession()).Acquire(t.Context(), res, lock.WithRequestID("grace-c"))
		next <- result{h, err}
	}()
	waitPhase(t, keyOf(ns, "grace-c"), lockingv1alpha1.PhasePending)

	cut.Store(true)
	var doneAt time.Time // by the registry's clock, no earlier than the Context ended
	var ended *lockingv1alpha1.LockGrant
	for range 100 {
		clk.Step(250 * time.Millisecond)
		hclk.Step(250 * time.Millisecond)
		if doneAt.IsZero() && checkErr(h) != nil {
			doneAt = clk.Now()
		}
		wake(t, h.Info().Grant)
		if g := grantOf(t, h.Info().Grant); g.Status.Phase.Final() {
			ended = g
			break
		}
	}
	if doneAt.IsZero() || ended == nil || ended.Status.EndedAt == nil {
		t.Fatalf("the handle was spent at %s, the registry ended the grant: %v", doneAt, ended != nil)
	}
	eventually(t, "the context ends", func() bool { return closed(h.Context().Done()) })
	if err := context.Cause(h.Context()); !errors.Is(err, lock.ErrOwnershipUnknown) || !errors.Is(err, lock.ErrSessionExpired) {
		t.Errorf("cause = %v, want ErrOwnershipUnknown and ErrSessionExpired", err)
	}
	n := <-next
	if n.err != nil {
		t.Fatal(n.err)
	}
	defer n.h.Release(context.Background()) //nolint:errcheck // test cleanup
	// Acquire may return on the counter's event, before the grant's status.
	granted := waitPhase(t, n.h.Info().Grant, lockingv1alpha1.PhaseHeld).Status.GrantedAt.Time
	t.Logf("the Context ended at %s, the registry ended the grant %s later (%s), the next waiter was granted %s later",
		doneAt.Format(time.RFC3339Nano), ended.Status.EndedAt.Sub(doneAt), ended.Status.Phase, granted.Sub(doneAt))
	if killed := doneAt.Add(grace); !killed.Before(ended.Status.EndedAt.Time) || !killed.Before(granted) {
		t.Errorf("work stopped within the %s grace of the Context's end could run until %s, after the registry ended the grant (%s) or granted the next waiter (%s)",
			grace, killed.Format(time.RFC3339Nano), ended.Status.EndedAt.Format(time.RFC3339Nano), granted.Format(time.RFC3339Nano))
	}
}

// sessionTTL reads the duration of session Lease name.
func sessionTTL(t *testing.T, ns, name string) time.Duration {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := admin.Get(t.Context(), keyIn(ns, name), l); err != nil {
		t.Fatal(err)
	}
	return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
}

// A stop grace the lease cannot leave room for is refused before anything
// is made.
func TestStopGraceThatDoesNotFitIsRefused(t *testing.T) {
	ns := namespace(t)
	locks := newTestClient(t, as(t, "sess-grace-c"), lock.WithNamespace(ns), lock.WithTTL(10*time.Second))
	if _, err := locks.Acquire(t.Context(), "ledger/grace-refused", lock.WithStopGrace(8*time.Second)); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Acquire with an 8 s stop grace on a 10 s lease: %v, want ErrInvalidOption", err)
	}
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Fatalf("a refused Acquire made %d grants (%v)", len(list.Items), err)
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
	if s := grantOf(t, h.Info().Grant).Spec.Session; s != nil {
		t.Fatalf("the request names session %+v, want none", s)
	}
}

func keyIn(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}
