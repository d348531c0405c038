package integration

import (
	"encoding/json"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// slotWorld is one namespace whose resource has 3 permits, held by a (slot
// 0) and by two replicas of one Deployment, b (slot 1) and c (slot 2),
// which share one service account; each slot has a guarded ConfigMap bound
// to its fenced resource ID, written by its holder.
type slotWorld struct {
	ns      string
	a, rep  *actor
	g       [3]*lockingv1alpha1.LockGrant
	objects [3]string
}

func newSlotWorld(t *testing.T) *slotWorld {
	t.Helper()
	w := &slotWorld{ns: namespace(t), a: as(t, "slot-a"), rep: as(t, "slot-rep")}
	tl := startTimeline()
	for k, who := range []*actor{w.a, w.rep, w.rep} {
		tl.at(0.1 * float64(k))
		w.g[k] = mustAcquireWith(t, who, w.ns, 600, withPermits(3))
		if got := w.g[k].HeldFencedResource(); got != lockingv1alpha1.SlotResource(resource, int32(k)) {
			t.Fatalf("grant %d holds %q, want slot %d", k, got, k)
		}
		w.objects[k] = fmt.Sprintf("slot-%d", k)
		if err := writeSlot(t, who, w.ns, w.objects[k], w.g[k].HeldFencedResource(), w.g[k], fmt.Sprint(k)); err != nil {
			t.Fatalf("slot %d's holder writing its own object: %v", k, err)
		}
	}
	return w
}

// slotClaim is the claim of grant g with the annotation binding the object
// to resource id.
func slotClaim(g *lockingv1alpha1.LockGrant, id string) map[string]string {
	c := claim(g)
	c[lockingv1alpha1.ResourceAnnotation] = id
	return c
}

func (w *slotWorld) cm(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}}
}

// update re-reads name as x, sets the annotations ann (an empty value
// deletes) and the data, and updates it.
func (w *slotWorld) update(t *testing.T, x *actor, name string, ann map[string]string) error {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := x.c.Get(t.Context(), client.ObjectKeyFromObject(w.cm(name)), cm); err != nil {
		return err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	for k, v := range ann {
		cm.Annotations[k] = v
		if v == "" {
			delete(cm.Annotations, k)
		}
	}
	cm.Data = map[string]string{"result": "attack"}
	return x.c.Update(t.Context(), cm)
}

// apply is a server-side apply of name as x under field manager owner,
// setting data and the annotations ann.
func (w *slotWorld) apply(t *testing.T, x *actor, name, owner string, ann map[string]string) error {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": w.ns, "annotations": ann},
		"data":     map[string]string{owner: "applied"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return x.c.Patch(t.Context(), w.cm(name), client.RawPatch(types.ApplyPatchType, body), client.FieldOwner(owner), client.ForceOwnership)
}

// A holder of one slot, or a replica that shares its identity with the
// holder of another, cannot write an object bound to another slot (or to
// plain R) by any verb or patch type, cannot rebind an object to another
// slot, and cannot write or delete without asserting its own claim in the
// request. Refused requests leave the object as it was.
func TestPermitsSlotObjectsRefuseOtherSlots(t *testing.T) {
	w := newSlotWorld(t)
	b, c := w.g[1], w.g[2]
	r1, r2 := lockingv1alpha1.SlotResource(resource, 1), lockingv1alpha1.SlotResource(resource, 2)
	attacks := []struct {
		name, object, want string
		do                 func(t *testing.T) error
	}{
		{"slot 2's replica updates slot 1's object with its own claim", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[1], claim(c))
		}},
		{"slot 2's replica merge-patches slot 1's object", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.rep.c.Patch(t.Context(), w.cm(w.objects[1]), client.RawPatch(types.MergePatchType,
				patchBody(t, claim(c), map[string]any{"data": map[string]string{"result": "attack"}})))
		}},
		{"slot 2's replica JSON-patches slot 1's object", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			ops := []map[string]any{{"op": "replace", "path": "/data/result", "value": "attack"}}
			for k, v := range claim(c) {
				ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + escape(k), "value": v})
			}
			body, _ := json.Marshal(ops)
			return w.rep.c.Patch(t.Context(), w.cm(w.objects[1]), client.RawPatch(types.JSONPatchType, body))
		}},
		{"slot 2's replica applies to slot 1's object under another field manager", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.apply(t, w.rep, w.objects[1], "intruder", claim(c))
		}},
		{"slot 2's replica applies to slot 1's object rebinding it to slot 2", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.apply(t, w.rep, w.objects[1], "intruder", slotClaim(c, r2))
		}},
		{"slot 1's holder writes the object bound to plain R", w.objects[0], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[0], claim(b))
		}},
		{"slot 0's holder writes slot 1's object", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.a, w.objects[1], claim(w.g[0]))
		}},
		{"slot 1's holder rebinds its object to slot 2", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[1], slotClaim(b, r2))
		}},
		{"slot 1's holder rebinds its object to plain R", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[1], slotClaim(b, resource))
		}},
		{"slot 1's holder rebinds slot 2's object to slot 1", w.objects[2], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[2], slotClaim(b, r1))
		}},
		{"slot 1's holder drops the resource annotation of its object", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[1], slotClaim(b, ""))
		}},
		{"slot 2's replica re-reads and updates its own object without a claim", w.objects[2], "NO_FENCE", func(t *testing.T) error {
			return w.update(t, w.rep, w.objects[2], nil)
		}},
		{"slot 2's replica applies its own object under a second field manager without a claim", w.objects[2], "NO_FENCE", func(t *testing.T) error {
			return w.apply(t, w.rep, w.objects[2], "sidecar", map[string]string{})
		}},
		{"slot 2's replica deletes slot 1's object without a precondition", w.objects[1], "NO_FENCE", func(t *testing.T) error {
			return w.rep.c.Delete(t.Context(), w.cm(w.objects[1]))
		}},
		{"slot 2's replica prepares a delete of slot 1's object", w.objects[1], "BINDING_MISMATCH", func(t *testing.T) error {
			ann := claim(c)
			ann[lockingv1alpha1.IntentAnnotation] = "delete"
			return w.update(t, w.rep, w.objects[1], ann)
		}},
	}
	for _, at := range attacks {
		t.Run(at.name, func(t *testing.T) {
			before := configMap(t, w.ns, at.object)
			wantReason(t, at.name, at.do(t), at.want)
			after := configMap(t, w.ns, at.object)
			if after == nil || after.ResourceVersion != before.ResourceVersion {
				t.Fatalf("a refused request changed the object")
			}
		})
	}

	// The holder itself applies under two field managers: the one that
	// asserts its claim is accepted, the other is not.
	if err := w.apply(t, w.rep, w.objects[1], "worker", claim(b)); err != nil {
		t.Fatalf("slot 1's holder applying its own object with its claim: %v", err)
	}
	wantRecorded(t, configMap(t, w.ns, w.objects[1]), w.ns+"/"+b.Name, fenceOf(b))
	wantReason(t, "a second field manager of the holder, without a claim", w.apply(t, w.rep, w.objects[1], "sidecar", map[string]string{}), "NO_FENCE")
}

// Only the one fenced resource ID of a slot binds an object: R#0, leading
// zeros, slots at or past the 64-permit maximum, negative or nested slots
// and a bare separator are refused when the object is created, whoever
// asks, and a resource ID with the separator is refused in a LockGrant, as
// are permits outside 1 to 64 or of another type.
func TestPermitsSlotIDsAreCanonical(t *testing.T) {
	w := newSlotWorld(t)
	for _, id := range []string{resource + "#0", resource + "#01", resource + "#64", resource + "#-1", resource + "#1#2", resource + "#", resource + "#+1", resource + "# 1", "#1"} {
		t.Run(id, func(t *testing.T) {
			name := fmt.Sprintf("bad-%d", objectSeq.Add(1))
			wantReason(t, "an object bound to "+id, writeSlot(t, w.rep, w.ns, name, id, w.g[1], "x"), "NO_RESOURCE")
			if configMap(t, w.ns, name) != nil {
				t.Fatalf("the refused object exists")
			}
		})
	}
	for _, id := range []string{resource + "#1", "other#1", "batch/nightly#"} {
		_, err := acquire(t, w.a, w.ns, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = id })
		wantReason(t, "a LockGrant for "+id, err, "INVALID_SPEC")
	}
	_, err := acquire(t, w.a, w.ns, 60, withPermits(0))
	if err != nil {
		t.Fatalf("permits 0 (unset, an exclusive lock): %v", err)
	}
	for _, permits := range []any{0, 65, "3", 1.5, -1} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": lockingv1alpha1.GroupVersion.String(), "kind": "LockGrant",
			"metadata": map[string]any{"namespace": w.ns, "generateName": "raw-"},
			"spec":     map[string]any{"resource": resource, "leaseDurationSeconds": int64(60), "permits": permits},
		}}
		if err := w.a.c.Create(t.Context(), u); err == nil {
			t.Fatalf("permits %#v: created %s, want refused", permits, u.GetName())
		} else if apierrors.IsForbidden(err) && reason(err) == "" {
			t.Fatalf("permits %#v: refused by RBAC (%v), want refused as invalid", permits, err)
		}
	}
}

// A slot's FenceCounter is the product's record: a user cannot create one
// (a forged holder for slot 3), nobody can delete one or create one under
// another name, and a counter created ahead of time with a high fence makes
// the slot's first grant's fence higher still.
func TestPermitsSlotCountersAreProtected(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	r3 := lockingv1alpha1.SlotResource(resource, 3)
	forged := func() *lockingv1alpha1.FenceCounter {
		return &lockingv1alpha1.FenceCounter{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(r3)},
			Spec:       lockingv1alpha1.FenceCounterSpec{Resource: r3, Fence: 41},
		}
	}
	if err := as(t, "ctr-a").c.Create(t.Context(), forged()); !apierrors.IsForbidden(err) {
		t.Fatalf("a user creating slot 3's counter: %v, want Forbidden by RBAC", err)
	}
	misnamed := forged()
	misnamed.Name = lockingv1alpha1.FenceCounterName(resource)
	if err := admin.Create(t.Context(), misnamed); reason(err) != "INVALID_SPEC" {
		t.Fatalf("slot 3's counter under slot 0's name: %v, want INVALID_SPEC", err)
	}
	if err := admin.Create(t.Context(), forged()); err != nil {
		t.Fatal(err)
	}
	var gs []*lockingv1alpha1.LockGrant
	for i := range 4 {
		tl.at(0.1 * float64(i))
		gs = append(gs, mustAcquireWith(t, as(t, fmt.Sprintf("ctr-%d", i)), ns, 600, withPermits(4)))
	}
	if got := gs[3]; got.HeldSlot() != 3 || got.Status.FenceToken != 42 {
		t.Fatalf("slot 3's first grant: slot %d fence %d, want slot 3 with fence 42, above the counter's 41", got.HeldSlot(), got.Status.FenceToken)
	}
	c := slotCounter(t, ns, 1)
	if err := admin.Delete(t.Context(), c); reason(err) != "COUNTER_PROTECTED" {
		t.Fatalf("deleting slot 1's counter: %v, want COUNTER_PROTECTED", err)
	}
	lower := c.DeepCopy()
	lower.Spec.Fence, lower.Spec.Holder = 0, nil
	if err := admin.Update(t.Context(), lower); err == nil {
		t.Fatalf("lowering slot 1's fence: accepted")
	}
	if err := writeSlot(t, as(t, "ctr-1"), ns, "slot-1", c.Spec.Resource, gs[1], "b"); err != nil {
		t.Fatalf("slot 1's holder after the refused counter changes: %v", err)
	}
}

// A lock-delay holds back only the slot whose holder expired: the other
// slot's holder keeps writing, the waiter waits it out (nobody behind it
// is granted), then gets that slot with its next fence, and the expired
// holder's late write is refused.
func TestPermitsLockDelayPerSlot(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquireWith(t, as(t, "pd-a"), ns, 600, withPermits(2), withLockDelay(20))
	tl.at(0.1)
	b := mustAcquireWith(t, as(t, "pd-b"), ns, 10, withPermits(2), withLockDelay(20))
	r1 := b.HeldFencedResource()
	if err := writeSlot(t, as(t, "pd-b"), ns, "slot-1", r1, b, "b"); err != nil {
		t.Fatal(err)
	}
	tl.at(0.2)
	c, err := acquire(t, as(t, "pd-c"), ns, 600, withPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	tl.at(0.3)
	d, err := acquire(t, as(t, "pd-d"), ns, 600, withPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, d, lockingv1alpha1.PhasePending)

	tl.at(10.5)
	wake(t, b)
	waitPhase(t, b, lockingv1alpha1.PhaseExpired)
	waitFor(t, c, "waiting out slot 1's lock-delay", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.Phase == lockingv1alpha1.PhasePending && readyReasonOf(g) == lockingv1alpha1.LockGrantReasonLockDelay
	})
	if g := get(t, d); g.Status.Phase != lockingv1alpha1.PhasePending {
		t.Fatalf("d: %s behind a head that waits out a lock-delay", g.Status.Phase)
	}
	if err := writeSlot(t, as(t, "pd-a"), ns, "slot-0", resource, a, "a"); err != nil {
		t.Fatalf("slot 0's holder during slot 1's lock-delay: %v", err)
	}

	tl.at(31)
	wake(t, c)
	c = waitPhase(t, c, lockingv1alpha1.PhaseHeld)
	if c.HeldFencedResource() != r1 || c.Status.FenceToken != b.Status.FenceToken+1 {
		t.Fatalf("c holds %s with fence %d, want %s with fence %d", c.HeldFencedResource(), c.Status.FenceToken, r1, b.Status.FenceToken+1)
	}
	wantReason(t, "slot 1's expired holder writing late", writeSlot(t, as(t, "pd-b"), ns, "slot-1", r1, b, "b-late"), "STALE_OWNER")
	if err := writeSlot(t, as(t, "pd-c"), ns, "slot-1", r1, c, "c"); err != nil {
		t.Fatalf("slot 1's new holder: %v", err)
	}
}

// An exclusive request (permits unset) behind holders of a resource with
// permits makes the limit 1: it waits until every slot is free and then
// holds slot 0, the resource itself, with a fence above every earlier
// slot-0 fence; the objects bound to plain R that slot 0's semaphore
// holder wrote accept it, and no slot's earlier holder.
func TestPermitsExclusiveRequestWaitsForEverySlot(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquireWith(t, as(t, "mix-a"), ns, 600, withPermits(2))
	tl.at(0.1)
	b := mustAcquireWith(t, as(t, "mix-b"), ns, 600, withPermits(2))
	if err := writeSlot(t, as(t, "mix-a"), ns, "plain", resource, a, "a"); err != nil {
		t.Fatal(err)
	}
	tl.at(0.2)
	e, err := acquire(t, as(t, "mix-e"), ns, 600)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, e, lockingv1alpha1.PhasePending)
	if err := release(t, as(t, "mix-a"), a); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, a, lockingv1alpha1.PhaseReleased)
	if g := get(t, e); g.Status.Phase != lockingv1alpha1.PhasePending {
		t.Fatalf("the exclusive request is %s while slot 1 is held", g.Status.Phase)
	}
	if err := release(t, as(t, "mix-b"), b); err != nil {
		t.Fatal(err)
	}
	e = waitPhase(t, e, lockingv1alpha1.PhaseHeld)
	if e.Status.Permit != nil || e.HeldFencedResource() != resource || e.Status.FenceToken != a.Status.FenceToken+1 {
		t.Fatalf("the exclusive grant: permit %v, %s, fence %d; want slot 0 (%s) with fence %d", e.Status.Permit, e.HeldFencedResource(), e.Status.FenceToken, resource, a.Status.FenceToken+1)
	}
	if err := writeSlot(t, as(t, "mix-e"), ns, "plain", resource, e, "e"); err != nil {
		t.Fatalf("the exclusive holder writing the object bound to R: %v", err)
	}
	wantReason(t, "slot 0's released semaphore holder", writeSlot(t, as(t, "mix-a"), ns, "plain", resource, a, "a-late"), "STALE_OWNER")
	wantReason(t, "slot 1's released semaphore holder", writeSlot(t, as(t, "mix-b"), ns, "plain", resource, b, "b-late"), "BINDING_MISMATCH")
}

// A request is only ever granted a slot below its own permits, and never
// more company than it asked for: an exclusive request (permits unset) that
// waits while a newer request raises the limit is granted slot 0, the
// resource itself with its own fence sequence, and only once it can hold
// alone. Nobody behind it barges meanwhile, and nobody joins it after.
func TestPermitsExclusiveRequestHoldsOnlySlotZero(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquireWith(t, as(t, "ex0-a"), ns, 600, withPermits(2))
	tl.at(0.1)
	b := mustAcquireWith(t, as(t, "ex0-b"), ns, 600, withPermits(2))
	tl.at(0.2)
	e, err := acquire(t, as(t, "ex0-e"), ns, 600)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, e, lockingv1alpha1.PhasePending)
	tl.at(0.3) // the newest request raises the limit to 3: slot 2 is free
	s, err := acquire(t, as(t, "ex0-s"), ns, 600, withPermits(3))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "queued", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.Phase == lockingv1alpha1.PhasePending && g.Status.QueuePosition != nil
	})
	if g := get(t, e); g.Status.Phase != lockingv1alpha1.PhasePending {
		t.Fatalf("the exclusive request is %s in %s while slot 0 is held; want Pending until slot 0 is free", g.Status.Phase, g.HeldFencedResource())
	}

	if err := release(t, as(t, "ex0-a"), a); err != nil {
		t.Fatal(err)
	}
	// The pass that ends a's grant swaps slot 0's counter: to nobody.
	if h := nextSlotHolder(t, ns, 0, a.Name); h != "" {
		t.Fatalf("slot 0 went to %s while b holds; want nobody: the exclusive head holds only alone, and nobody passes it", h)
	}
	if err := release(t, as(t, "ex0-b"), b); err != nil {
		t.Fatal(err)
	}
	e = waitPhase(t, e, lockingv1alpha1.PhaseHeld)
	if e.Status.Permit != nil || e.HeldFencedResource() != resource || e.Status.FenceToken != a.Status.FenceToken+1 {
		t.Fatalf("the exclusive grant: permit %v, %s, fence %d; want slot 0 (%s) with fence %d", e.Status.Permit, e.HeldFencedResource(), e.Status.FenceToken, resource, a.Status.FenceToken+1)
	}
	for k := int32(1); k < 3; k++ {
		if h := slotHolder(t, ns, k); h != "" {
			t.Fatalf("permit %d is held by %s beside the exclusive holder; want nobody", k, h)
		}
	}
	if err := release(t, as(t, "ex0-e"), e); err != nil {
		t.Fatal(err)
	}
	if s = waitPhase(t, s, lockingv1alpha1.PhaseHeld); s.HeldSlot() != 0 || s.Status.FenceToken != e.Status.FenceToken+1 {
		t.Fatalf("the request for 3 permits holds slot %d at fence %d, want slot 0 at %d", s.HeldSlot(), s.Status.FenceToken, e.Status.FenceToken+1)
	}
}

// Shrinking and growing back: a holder put over the limit by a newer
// request for fewer permits is within it again (WithinLimit True) once a
// still newer request names more, and keeps its slot and fence throughout;
// nobody is granted while the holders fill the limit, and the request for
// one permit holds only alone.
func TestPermitsShrinkThenGrowRestoresTheLimit(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquireWith(t, as(t, "sg-a"), ns, 600, withPermits(2))
	tl.at(0.1)
	b := mustAcquireWith(t, as(t, "sg-b"), ns, 600, withPermits(2))
	tl.at(0.2)
	w1, err := acquire(t, as(t, "sg-w1"), ns, 600, withPermits(1))
	if err != nil {
		t.Fatal(err)
	}
	cond := func(status metav1.ConditionStatus, reason string) func(*lockingv1alpha1.LockGrant) bool {
		return func(g *lockingv1alpha1.LockGrant) bool {
			c := withinLimit(g)
			return g.Status.Phase == lockingv1alpha1.PhaseHeld && c != nil && c.Status == status && c.Reason == reason
		}
	}
	waitFor(t, b, "Held over the lowered limit", cond(metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonOverLimit))
	tl.at(0.3)
	w2, err := acquire(t, as(t, "sg-w2"), ns, 600, withPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	b = waitFor(t, b, "Held within the limit again", cond(metav1.ConditionTrue, lockingv1alpha1.LockGrantReasonWithinLimit))
	if b.HeldSlot() != 1 || b.Status.FenceToken != 1 {
		t.Fatalf("b: slot %d fence %d, want its slot 1 and fence 1 kept", b.HeldSlot(), b.Status.FenceToken)
	}
	for _, w := range []*lockingv1alpha1.LockGrant{w1, w2} {
		if g := get(t, w); g.Status.Phase == lockingv1alpha1.PhaseHeld {
			t.Fatalf("%s granted while 2 grants hold 2 permits", g.Name)
		}
	}
	if err := release(t, as(t, "sg-a"), a); err != nil {
		t.Fatal(err)
	}
	if h := nextSlotHolder(t, ns, 0, a.Name); h != "" {
		t.Fatalf("slot 0 went to %s while b holds; want nobody: w1 asked for one permit and holds only alone", h)
	}
	if err := release(t, as(t, "sg-b"), b); err != nil {
		t.Fatal(err)
	}
	w1 = waitPhase(t, w1, lockingv1alpha1.PhaseHeld)
	if w1.HeldFencedResource() != resource || w1.Status.FenceToken != 2 {
		t.Fatalf("w1: %s fence %d, want slot 0 with fence 2", w1.HeldFencedResource(), w1.Status.FenceToken)
	}
	if h := slotHolder(t, ns, 1); h != "" {
		t.Fatalf("permit 1 is held by %s beside w1, which asked for one permit; want nobody", h)
	}
	if err := release(t, as(t, "sg-w1"), w1); err != nil {
		t.Fatal(err)
	}
	if g := waitPhase(t, w2, lockingv1alpha1.PhaseHeld); g.HeldSlot() != 0 || g.Status.FenceToken != 3 {
		t.Fatalf("w2: slot %d fence %d, want slot 0 with fence 3", g.HeldSlot(), g.Status.FenceToken)
	}
}

// slotHolder is the grant slot k's counter names as holder; "" when none
// (or no counter yet).
func slotHolder(t *testing.T, ns string, k int32) string {
	t.Helper()
	c := &lockingv1alpha1.FenceCounter{}
	err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(lockingv1alpha1.SlotResource(resource, k))}, c)
	switch {
	case apierrors.IsNotFound(err):
		return ""
	case err != nil:
		t.Fatal(err)
	}
	if c.Spec.Holder == nil {
		return ""
	}
	return c.Spec.Holder.Name
}

// nextSlotHolder waits until slot k's counter no longer names grant was,
// and returns the holder it names then: the outcome of the pass that ended
// was's grant, which swaps the counter once, for its next holder or none.
func nextSlotHolder(t *testing.T, ns string, k int32, was string) string {
	t.Helper()
	var h string
	waitUntil(t, "permit "+fmt.Sprint(k)+" no longer held by "+was, func() (bool, error) {
		h = slotHolder(t, ns, k)
		return h != was, nil
	})
	return h
}
