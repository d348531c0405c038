package integration

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Fifty acquirers of one resource at once: each is granted in FIFO order of
// its request, with a unique fence strictly increasing in grant order, and
// never two Held at once; every holder's guarded write is accepted.
func TestFiftyConcurrentAcquirers(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	const n = 50
	grants := make([]*lockingv1alpha1.LockGrant, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			g, err := acquire(t, as(t, fmt.Sprintf("racer-%02d", i)), ns, 60)
			grants[i] = g
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Everyone but the first holder is queued before any handoff.
	first := soleHolder(t, ns)
	for _, g := range grants {
		if g.UID != first.UID {
			waitPhase(t, g, lockingv1alpha1.PhasePending)
		}
	}
	// FIFO is admission order: the requested-at stamp, then UID (the fake
	// clock gives every request of this test the same stamp).
	want := []string{string(first.UID)}
	var rest []string
	for _, g := range grants {
		if g.UID != first.UID {
			rest = append(rest, string(g.UID))
		}
	}
	slices.SortFunc(rest, func(x, y string) int { return compareRequests(grants, x, y) })
	want = append(want, rest...)

	var order []string
	var fences []int64
	for range n {
		holder := soleHolder(t, ns)
		order = append(order, string(holder.UID))
		fences = append(fences, holder.Status.FenceToken)
		a := as(t, holder.Spec.Owner[len("system:serviceaccount:billing:"):])
		if err := write(t, a, ns, "shared", holder, fenceOf(holder), holder.Name); err != nil {
			t.Fatalf("holder %s (fence %d) write: %v", holder.Name, holder.Status.FenceToken, err)
		}
		if err := release(t, a, holder); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, holder, lockingv1alpha1.PhaseReleased)
	}
	for i := range fences {
		if fences[i] != int64(i+1) {
			t.Fatalf("fences in grant order = %v, want 1..%d", fences, n)
		}
	}
	if !slices.Equal(order, want) {
		t.Fatalf("grant order is not FIFO:\n got %v\nwant %v", order, want)
	}
}

// soleHolder waits until exactly one grant of the namespace is Held and
// fails if two ever are.
func soleHolder(t *testing.T, ns string) *lockingv1alpha1.LockGrant {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var held []*lockingv1alpha1.LockGrant
		for i := range list.Items {
			if list.Items[i].Status.Phase == lockingv1alpha1.PhaseHeld {
				held = append(held, &list.Items[i])
			}
		}
		switch len(held) {
		case 1:
			return held[0]
		case 0:
			time.Sleep(10 * time.Millisecond)
		default:
			t.Fatalf("%d grants Held at once", len(held))
		}
	}
	t.Fatal("no grant became Held")
	return nil
}

func compareRequests(grants []*lockingv1alpha1.LockGrant, x, y string) int {
	find := func(uid string) *lockingv1alpha1.LockGrant {
		for _, g := range grants {
			if string(g.UID) == uid {
				return g
			}
		}
		return nil
	}
	gx, gy := find(x), find(y)
	tx, _ := time.Parse(time.RFC3339Nano, gx.Annotations[lockingv1alpha1.RequestedAtAnnotation])
	ty, _ := time.Parse(time.RFC3339Nano, gy.Annotations[lockingv1alpha1.RequestedAtAnnotation])
	if c := tx.Compare(ty); c != 0 {
		return c
	}
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Requests made one after another are granted in that order.
func TestFIFOOrderOfRequests(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	first := mustAcquire(t, as(t, "fifo-0"), ns, 60)
	var queued []*lockingv1alpha1.LockGrant
	for i := 1; i <= 5; i++ {
		tl.at(float64(i) / 1000) // one request per millisecond
		g, err := acquire(t, as(t, fmt.Sprintf("fifo-%d", i)), ns, 60)
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, g)
	}
	for i, g := range queued {
		waitFor(t, g, "queued", func(g *lockingv1alpha1.LockGrant) bool {
			return g.Status.QueuePosition != nil && int(*g.Status.QueuePosition) == i
		})
	}
	holder := first
	for i, g := range queued {
		if err := release(t, as(t, fmt.Sprintf("fifo-%d", i)), holder); err != nil {
			t.Fatal(err)
		}
		holder = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
		if holder.Status.FenceToken != int64(i+2) {
			t.Fatalf("request %d got fence %d, want %d", i+1, holder.Status.FenceToken, i+2)
		}
	}
}
