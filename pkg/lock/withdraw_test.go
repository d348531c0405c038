package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// An Acquire cancelled at any moment of its create leaves no grant behind
// that waits or holds: the library finds its own request by its name and
// withdraws it, also when the cancellation cut the create off before any
// answer came. A waiter's client with a live session calls Acquire on a
// busy resource and cancels it 0, 1, 2, ... ms later; after each call, none
// of its grants may be left Pending or Held, and once the holder releases,
// the next waiter gets the lock at once (an orphan would hold it for the
// whole TTL, and forever on this suite's fake clock).
func TestCancelledAcquireLeavesNoGrant(t *testing.T) {
	ns := namespace(t)
	if err := env.GrantUsersSessions(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	const resource = "n10/r3"
	a := newTestClient(t, as(t, "cancel-a"), lock.WithNamespace(ns))
	ha, err := a.Acquire(t.Context(), resource, lock.WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	wc := as(t, "cancel-w")
	w := newTestClient(t, wc, lock.WithNamespace(ns))
	// A warm client: its session exists before the first try.
	warm, err := w.Acquire(t.Context(), "n10/warm", lock.WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	release(t, warm, "")

	const tries = 40 // one per millisecond of the create, and past it
	var orphans []string
	seen := map[string]bool{} // grants counted already
	landed := 0
	for d := range tries {
		ctx, cancel := context.WithCancel(t.Context())
		stop := time.AfterFunc(time.Duration(d)*time.Millisecond, cancel)
		h, err := w.Acquire(ctx, resource, lock.WithTTL(15*time.Second), lock.WithWait(time.Minute))
		stop.Stop()
		cancel()
		if err == nil {
			t.Fatalf("cancel after %d ms: Acquire returned %s while %s holds the resource", d, h.Info().Grant, ha.Info().Grant)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel after %d ms: %v, want context.Canceled", d, err)
		}
		// Acquire has returned: every grant of W is ended or withdrawn.
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, g := range list.Items {
			if g.Spec.Resource != resource || g.UID == ha.Info().UID || seen[string(g.UID)] {
				continue
			}
			seen[string(g.UID)] = true
			landed++
			if !g.Status.Phase.Final() && !g.Spec.Release {
				orphans = append(orphans, fmt.Sprintf("%s (%s, cancel after %d ms)", g.Name, g.Status.Phase, d))
			}
		}
	}
	if len(orphans) > 0 {
		t.Fatalf("%d of %d cancelled Acquires left a grant that waits or holds with no handle: %v", len(orphans), tries, orphans)
	}
	t.Logf("%d cancelled Acquires made %d grants, every one withdrawn", tries, landed)

	// The queue is clear: once A releases, the next waiter holds at once.
	c := newTestClient(t, as(t, "cancel-c"), lock.WithNamespace(ns))
	next := make(chan error, 1)
	go func() {
		hc, err := c.Acquire(t.Context(), resource, lock.WithTTL(15*time.Second), lock.WithWait(time.Minute))
		if err == nil {
			release(t, hc, "")
		}
		next <- err
	}()
	eventually(t, "C waits in the queue", func() bool {
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			return false
		}
		for _, g := range list.Items {
			if g.Spec.Owner == "system:serviceaccount:billing:cancel-c" && g.Status.Phase == lockingv1alpha1.PhasePending {
				return true
			}
		}
		return false
	})
	released := time.Now()
	release(t, ha, "")
	select {
	case err := <-next:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("C held %s after A's release", time.Since(released).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("C did not get the lock within 10 s of A's release: a cancelled request holds it or waits ahead of C")
	}
}

// A Release whose context ends before any answer leaves the lock held no
// longer than the library needs to finish it: the handle goes on releasing
// on a context of its own, and a later Release returns that answer.
func TestReleaseWithoutAnAnswerIsFinished(t *testing.T) {
	ns := namespace(t)
	locks := newTestClient(t, as(t, "unanswered-a"), lock.WithNamespace(ns))
	h, err := locks.Acquire(t.Context(), "n10/unanswered", lock.WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the caller gave up before the request could be answered
	if err := h.Release(ctx); err == nil || lock.Refusal(err) != nil {
		t.Fatalf("Release with a cancelled context: %v, want an error with no definite answer", err)
	}
	waitPhase(t, h.Info().Grant, lockingv1alpha1.PhaseReleased)
	release(t, h, "")
}
