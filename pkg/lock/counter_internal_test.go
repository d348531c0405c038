package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// waitingHandle is a handle that created g and read it Pending, following
// its resource's counter: what Acquire has while it waits.
func waitingHandle(t *testing.T, g *lockingv1alpha1.LockGrant) *Handle {
	t.Helper()
	return createdHandle(t, g, true)
}

// counterNaming is resource's FenceCounter at fence with holder (nil: none).
func counterNaming(resource string, fence int64, hold *lockingv1alpha1.FenceHolder) *lockingv1alpha1.FenceCounter {
	return &lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Resource: resource, Fence: fence, Holder: hold}}
}

// feedCounter and feedGrant apply one read as the handle's loop does.
func (h *Handle) feedCounter(fc *lockingv1alpha1.FenceCounter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observeCounter(h.mono(), fc)
	h.publish()
}

func (h *Handle) feedGrant(g *lockingv1alpha1.LockGrant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observe(h.mono(), g)
	h.publish()
}

// An exclusive holder learns that it holds from its resource's counter, the
// controller's first write: Held with the counter's fence before its status
// arrives. The signed record comes with the status; AwaitRecord waits for
// it, and a status with another fence than the counter's stops the handle.
func TestHeldFromTheFenceCounter(t *testing.T) {
	g := grantFixture("invoice-batch/nightly", nil, "", "invoice-batch/nightly")
	g.Status.Record.FenceToken = 7
	h := waitingHandle(t, g)
	if st := h.State(); st != holder.Requested {
		t.Fatalf("state %s, want REQUESTED", st)
	}
	// Another grant's counter, then the counter moving on past it: nothing
	// happens to a waiter.
	h.feedCounter(counterNaming(g.Spec.Resource, 6, &lockingv1alpha1.FenceHolder{Name: "other", UID: "uid-0", Fence: 6}))
	h.feedCounter(counterNaming(g.Spec.Resource, 6, nil))
	if st := h.State(); st != holder.Requested {
		t.Fatalf("after another grant's counter: state %s, want REQUESTED", st)
	}

	h.feedCounter(counterNaming(g.Spec.Resource, 7, &lockingv1alpha1.FenceHolder{Name: g.Name, UID: string(g.UID), Fence: 7}))
	if h.State() != holder.Held || h.Info().Fence != 7 || checkErr(h) != nil {
		t.Fatalf("after the counter named it: state %s, fence %d, Check %v; want HELD with fence 7", h.State(), h.Info().Fence, checkErr(h))
	}
	if h.Record() != nil || h.Proof() != "" {
		t.Fatalf("record %+v, proof %q before the status arrived; want none yet", h.Record(), h.Proof())
	}
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if rec, err := h.AwaitRecord(short); rec != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AwaitRecord before the status: %+v, %v; want the context's deadline", rec, err)
	}
	got := make(chan *lockingv1alpha1.GrantRecord, 1)
	go func() {
		rec, err := h.AwaitRecord(t.Context())
		if err != nil {
			t.Error(err)
		}
		got <- rec
	}()
	h.feedGrant(g)
	select {
	case rec := <-got:
		if rec == nil || rec.FenceToken != 7 {
			t.Fatalf("AwaitRecord returned %+v, want the status's record with fence 7", rec)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitRecord did not return once the status arrived")
	}
	if h.State() != holder.Held || h.Info().Fence != 7 {
		t.Fatalf("after the status: state %s, fence %d; want HELD with 7", h.State(), h.Info().Fence)
	}

	// A status that names another fence than the counter did stops it.
	h2 := waitingHandle(t, g)
	h2.feedCounter(counterNaming(g.Spec.Resource, 8, &lockingv1alpha1.FenceHolder{Name: g.Name, UID: string(g.UID), Fence: 8}))
	h2.feedGrant(g)
	if err := context.Cause(h2.Context()); !errors.Is(err, ErrLost) || fencing.ReasonOf(err) != fencing.ReasonBindingMismatch {
		t.Fatalf("after a status with fence 7 under a counter that issued 8: %v, want ErrLost with BINDING_MISMATCH", err)
	}
}

// A holder learns that it no longer holds from the counter too, with the
// reason admission gives its writes: STALE_OWNER once another grant holds a
// newer fence, EXPIRED once the counter names nobody. Its own release is
// not a loss, and neither is a counter from before it held.
func TestLostFromTheFenceCounter(t *testing.T) {
	g := grantFixture("invoice-batch/nightly", nil, "", "")
	self := &lockingv1alpha1.FenceHolder{Name: g.Name, UID: string(g.UID), Fence: 7}
	for _, tc := range []struct {
		name    string
		counter *lockingv1alpha1.FenceCounter
		want    fencing.Reason
	}{
		{"another holder", counterNaming(g.Spec.Resource, 8, &lockingv1alpha1.FenceHolder{Name: "next", UID: "uid-2", Fence: 8}), fencing.ReasonStaleOwner},
		{"no holder", counterNaming(g.Spec.Resource, 7, nil), fencing.ReasonExpired},
		{"counter deleted", nil, ""},
		{"an older counter", counterNaming(g.Spec.Resource, 6, &lockingv1alpha1.FenceHolder{Name: "prev", UID: "uid-0", Fence: 6}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := waitingHandle(t, g)
			h.feedCounter(counterNaming(g.Spec.Resource, 7, self))
			h.feedGrant(g)
			h.feedCounter(tc.counter)
			err := context.Cause(h.Context())
			if tc.want == "" {
				if err != nil || checkErr(h) != nil {
					t.Fatalf("cause %v, Check %v; want the handle still holding", err, checkErr(h))
				}
				return
			}
			if !errors.Is(err, ErrLost) || fencing.ReasonOf(err) != tc.want || !closed(h.Context().Done()) {
				t.Fatalf("cause %v (context ended %v), want ErrLost with %s", err, closed(h.Context().Done()), tc.want)
			}
			if checkErr(h) == nil {
				t.Fatal("Check passes after the loss")
			}
		})
	}

	// Releasing: the counter freeing the resource is the release landing.
	h := waitingHandle(t, g)
	h.feedCounter(counterNaming(g.Spec.Resource, 7, self))
	h.feedGrant(g)
	h.mu.Lock()
	h.m.ReleaseSent(h.mono())
	h.mu.Unlock()
	h.feedCounter(counterNaming(g.Spec.Resource, 7, nil))
	if err := context.Cause(h.Context()); errors.Is(err, ErrLost) {
		t.Fatalf("a release's own counter write ended the handle as lost: %v", err)
	}
}

// A caller that may not read FenceCounters learns from the status alone:
// the counter's watch gives up on a refusal that retrying cannot change.
func TestCounterWatchGivesUpOnRefusals(t *testing.T) {
	gr := schema.GroupResource{Group: lockingv1alpha1.GroupVersion.Group, Resource: "fencecounters"}
	for _, err := range []error{apierrors.NewForbidden(gr, "x", errors.New("rbac")), apierrors.NewUnauthorized("no"), apierrors.NewNotFound(gr, "")} {
		if !refusedForGood(err) {
			t.Errorf("refusedForGood(%v) = false, want true", err)
		}
	}
	for _, err := range []error{apierrors.NewServiceUnavailable("down"), apierrors.NewTooManyRequests("slow", 1), context.DeadlineExceeded} {
		if refusedForGood(err) {
			t.Errorf("refusedForGood(%v) = true, want false: retried", err)
		}
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
