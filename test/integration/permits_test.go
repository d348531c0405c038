package integration

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func withPermits(n int32) func(*lockingv1alpha1.LockGrant) {
	return func(g *lockingv1alpha1.LockGrant) { g.Spec.Permits = n }
}

// writeSlot makes a guarded write of ConfigMap name, bound to the fenced
// resource id (one slot of the resource), as a under grant g.
func writeSlot(t *testing.T, a *actor, ns, name, id string, g *lockingv1alpha1.LockGrant, data string) error {
	t.Helper()
	return writeCM(t, a, ns, name, data, map[string]string{
		lockingv1alpha1.ResourceAnnotation: id,
		lockingv1alpha1.GrantAnnotation:    g.Name,
		lockingv1alpha1.FenceAnnotation:    fenceOf(g),
	}, map[string]string{lockingv1alpha1.GuardedLabel: "true"})
}

func slotCounter(t *testing.T, ns string, k int32) *lockingv1alpha1.FenceCounter {
	t.Helper()
	c := &lockingv1alpha1.FenceCounter{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(lockingv1alpha1.SlotResource(resource, k))}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

func withinLimit(g *lockingv1alpha1.LockGrant) *metav1.Condition {
	return meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionWithinLimit)
}

// A resource with 3 permits and 5 requesters: the first 3 hold distinct
// slots 0, 1, 2, each fenced by its own counter, the others wait in FIFO
// order; a guarded object bound to slot 1 accepts only slot 1's holder; a
// release hands its slot to the next waiter with that slot's next fence.
func TestPermitsGrantSlotsInFIFOOrder(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	names := []string{"sem-a", "sem-b", "sem-c", "sem-d", "sem-e"}
	var gs []*lockingv1alpha1.LockGrant
	for i, n := range names {
		tl.at(0.1 * float64(i)) // admitted in this order
		g, err := acquire(t, as(t, n), ns, 60, withPermits(3))
		if err != nil {
			t.Fatalf("%s acquiring: %v", n, err)
		}
		if i < 3 {
			g = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
		} else {
			g = waitPhase(t, g, lockingv1alpha1.PhasePending)
		}
		gs = append(gs, g)
	}
	for k := range int32(3) {
		g := gs[k]
		if g.Status.Permit == nil || *g.Status.Permit != k || g.Status.FencedResource != lockingv1alpha1.SlotResource(resource, k) {
			t.Fatalf("%s: permit %v, fenced resource %q; want permit %d", g.Name, g.Status.Permit, g.Status.FencedResource, k)
		}
		if g.Status.FenceToken != 1 || g.Status.Record == nil || g.Status.Record.Resource != g.Status.FencedResource {
			t.Fatalf("%s: fence %d, record %+v; want the first fence of its slot, its record naming the slot", g.Name, g.Status.FenceToken, g.Status.Record)
		}
		if c := slotCounter(t, ns, k); c.Spec.Holder == nil || c.Spec.Holder.Name != g.Name || c.Spec.Fence != 1 {
			t.Fatalf("slot %d counter = %+v, want held by %s at fence 1", k, c.Spec, g.Name)
		}
	}
	if gs[3].Status.QueuePosition == nil || *gs[3].Status.QueuePosition != 0 || gs[4].Status.QueuePosition == nil || *gs[4].Status.QueuePosition != 1 {
		t.Fatalf("queue positions %v, %v; want 0 and 1", gs[3].Status.QueuePosition, gs[4].Status.QueuePosition)
	}

	// Slot 1's object: its holder writes; slot 2's holder is refused.
	slot1 := lockingv1alpha1.SlotResource(resource, 1)
	if err := writeSlot(t, as(t, "sem-b"), ns, "slot-1", slot1, gs[1], "b"); err != nil {
		t.Fatalf("slot 1's holder writing slot 1's object: %v", err)
	}
	wantReason(t, "slot 2's holder writing slot 1's object", writeSlot(t, as(t, "sem-c"), ns, "slot-1", slot1, gs[2], "c"), "BINDING_MISMATCH")

	// b releases slot 1: d, the head, gets it with fence 2.
	if err := release(t, as(t, "sem-b"), gs[1]); err != nil {
		t.Fatal(err)
	}
	d := waitPhase(t, gs[3], lockingv1alpha1.PhaseHeld)
	if d.Status.Permit == nil || *d.Status.Permit != 1 || d.Status.FenceToken != 2 {
		t.Fatalf("d: permit %v fence %d; want slot 1 with fence 2", d.Status.Permit, d.Status.FenceToken)
	}
	if e := get(t, gs[4]); e.Status.Phase != lockingv1alpha1.PhasePending {
		t.Fatalf("e: %s, want still waiting", e.Status.Phase)
	}
	if err := writeSlot(t, as(t, "sem-d"), ns, "slot-1", slot1, d, "d"); err != nil {
		t.Fatalf("slot 1's new holder writing: %v", err)
	}
	wantReason(t, "slot 1's released holder writing", writeSlot(t, as(t, "sem-b"), ns, "slot-1", slot1, gs[1], "b-late"), "STALE_OWNER")
	if data, fence := readCM(t, ns, "slot-1"); data != "d" || fence != "2" {
		t.Fatalf("slot 1's object: %q at fence %s; want d's write at fence 2", data, fence)
	}
}

// Lowering the limit to 1 revokes nobody: the 3 holders keep their slots
// (slots 1 and 2 OverLimit), nobody is granted until one holder is left
// and it leaves; then the waiter gets slot 0.
func TestPermitsShrinkRevokesNobody(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	var held []*lockingv1alpha1.LockGrant
	for i, n := range []string{"shrink-a", "shrink-b", "shrink-c"} {
		tl.at(0.1 * float64(i))
		held = append(held, mustAcquireWith(t, as(t, n), ns, 60, withPermits(3)))
	}
	tl.at(0.5) // the newest request: its permits are the limit
	w, err := acquire(t, as(t, "shrink-w"), ns, 60, withPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{1, 2} {
		g := waitFor(t, held[k], "OverLimit", func(g *lockingv1alpha1.LockGrant) bool {
			c := withinLimit(g)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == lockingv1alpha1.LockGrantReasonOverLimit
		})
		if g.Status.Phase != lockingv1alpha1.PhaseHeld {
			t.Fatalf("%s: %s, want still Held", g.Name, g.Status.Phase)
		}
	}
	if g := get(t, held[0]); withinLimit(g) != nil || g.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("%s in slot 0: %s, %+v; want Held within the limit", g.Name, g.Status.Phase, withinLimit(g))
	}
	waitPhase(t, w, lockingv1alpha1.PhasePending)

	for i, who := range []string{"shrink-a", "shrink-b"} {
		if err := release(t, as(t, who), held[i]); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, held[i], lockingv1alpha1.PhaseReleased)
		if g := get(t, w); g.Status.Phase != lockingv1alpha1.PhasePending {
			t.Fatalf("w granted while %d grants still hold, over the limit of 1", 2-i)
		}
	}
	if err := release(t, as(t, "shrink-c"), held[2]); err != nil {
		t.Fatal(err)
	}
	w = waitPhase(t, w, lockingv1alpha1.PhaseHeld)
	if w.Status.Permit != nil || w.Status.FenceToken != 2 || w.Status.Record.Resource != resource {
		t.Fatalf("w: permit %v fence %d record %+v; want slot 0 (the resource itself) with fence 2", w.Status.Permit, w.Status.FenceToken, w.Status.Record)
	}
}

// A slot holder whose lease expires hands its slot to the next waiter.
func TestPermitsExpiryHandsTheSlotOver(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquireWith(t, as(t, "exp-a"), ns, 60, withPermits(2))
	tl.at(0.1)
	b := mustAcquireWith(t, as(t, "exp-b"), ns, 10, withPermits(2))
	tl.at(0.2)
	c, err := acquire(t, as(t, "exp-c"), ns, 60, withPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, c, lockingv1alpha1.PhasePending)
	tl.at(10.1)
	wake(t, b)
	waitPhase(t, b, lockingv1alpha1.PhaseExpired)
	c = waitPhase(t, c, lockingv1alpha1.PhaseHeld)
	if c.Status.Permit == nil || *c.Status.Permit != *b.Status.Permit || c.Status.FenceToken != b.Status.FenceToken+1 {
		t.Fatalf("c: permit %v fence %d; want b's slot %d with fence %d", c.Status.Permit, c.Status.FenceToken, *b.Status.Permit, b.Status.FenceToken+1)
	}
	if g := get(t, a); g.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("a: %s, want still Held", g.Status.Phase)
	}
}

// Permits are validated by the CRD: from 1 to 64, and immutable.
func TestPermitsValidation(t *testing.T) {
	ns := namespace(t)
	for _, n := range []int32{-1, 65} {
		_, err := acquire(t, as(t, "val-a"), ns, 60, withPermits(n))
		if err == nil || !slices.Contains([]string{"INVALID_SPEC"}, reason(err)) {
			t.Fatalf("permits %d: %v, want INVALID_SPEC", n, err)
		}
	}
	g := mustAcquireWith(t, as(t, "val-a"), ns, 60, withPermits(2))
	wantReason(t, "changing permits", patchGrant(t, as(t, "val-a"), g, map[string]any{"permits": 3}), "INVALID_SPEC")
}

// mustAcquireWith acquires with options and waits until Held.
func mustAcquireWith(t *testing.T, a *actor, ns string, ttl int32, mutate ...func(*lockingv1alpha1.LockGrant)) *lockingv1alpha1.LockGrant {
	t.Helper()
	g, err := acquire(t, a, ns, ttl, mutate...)
	if err != nil {
		t.Fatalf("%s acquiring: %v", a.name, err)
	}
	return waitPhase(t, g, lockingv1alpha1.PhaseHeld)
}
