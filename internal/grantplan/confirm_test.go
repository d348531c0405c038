package grantplan

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A plan says which grants it ends while their copy reads Held and no
// counter names them, and which it grants: the grants a pass reads
// directly before it writes.
func TestEndsUnnamedAndNewHolders(t *testing.T) {
	t.Run("a Held grant the counter no longer names", func(t *testing.T) {
		a, b := held(grant("a", 0, 30), 1, 31), held(grant("b", 1, 30), 2, 32)
		f := Facts{Now: sec(2), Resource: res, Counter: counter(2, &b), Grants: []lockingv1alpha1.LockGrant{a, b}}
		p := Decide(f)
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired {
			t.Fatalf("a = %+v; want the plan to end it (superseded)", s)
		}
		if got := EndsUnnamed(f, p); !slices.Equal(got, []types.UID{"uid-a"}) {
			t.Fatalf("EndsUnnamed = %v; want [uid-a]", got)
		}
		if got := NewHolders(f, p); len(got) != 0 {
			t.Fatalf("NewHolders = %v; want none, b already holds", got)
		}
		w := Without(p, EndsUnnamed(f, p))
		if statusOf(w, "a") != nil || slices.ContainsFunc(w.Events, func(e Event) bool { return e.Grant.Name == "a" }) {
			t.Fatalf("Without left a's status or events: %+v", w)
		}
		if statusOf(p, "a") == nil {
			t.Fatal("Without changed the plan it was given")
		}
	})
	t.Run("a holder the counter names ends on its lease, not unnamed", func(t *testing.T) {
		a, b := held(grant("a", 0, 30), 1, 31), grant("b", 1, 30)
		a.Spec.Release = true
		f := Facts{Now: sec(2), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, b}}
		p := Decide(f)
		if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseReleased {
			t.Fatalf("a = %+v; want Released", s)
		}
		if got := EndsUnnamed(f, p); len(got) != 0 {
			t.Fatalf("EndsUnnamed = %v; want none", got)
		}
		if got := NewHolders(f, p); !slices.Equal(got, []types.UID{"uid-b"}) {
			t.Fatalf("NewHolders = %v; want [uid-b]", got)
		}
	})
	t.Run("a grant Held in a slot whose counter names another", func(t *testing.T) {
		a, b := held(grant("a", 0, 30), 1, 31), held(grant("b", 1, 30), 1, 32)
		for _, g := range []*lockingv1alpha1.LockGrant{&a, &b} {
			g.Spec.Permits = 2
			k := int32(1)
			if g == &b {
				k = 0
			}
			g.Status.Permit, g.Status.FencedResource = &k, lockingv1alpha1.SlotResource(res, k)
		}
		c1 := counter(2, nil)
		c1.Spec.Resource = lockingv1alpha1.SlotResource(res, 1)
		f := Facts{Now: sec(2), Resource: res, Counter: counter(1, &b), SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{1: c1},
			Grants: []lockingv1alpha1.LockGrant{a, b}}
		p := Decide(f)
		if got := EndsUnnamed(f, p); !slices.Equal(got, []types.UID{"uid-a"}) {
			t.Fatalf("EndsUnnamed = %v; want [uid-a] (slot 1's counter names nobody)", got)
		}
	})
}

// The grants cache covers a pass only when it has shown every change up to
// the version of every counter the pass decided on.
func TestCacheCovers(t *testing.T) {
	at := func(rv string) *lockingv1alpha1.FenceCounter {
		return &lockingv1alpha1.FenceCounter{ObjectMeta: metav1.ObjectMeta{ResourceVersion: rv}}
	}
	cases := []struct {
		name string
		f    Facts
		seen string
		want bool
	}{
		{"counter at the mark", Facts{Counter: at("120")}, "120", true},
		{"counter below the mark", Facts{Counter: at("99")}, "120", true},
		{"counter past the mark", Facts{Counter: at("121")}, "120", false},
		{"compared as numbers, not as text", Facts{Counter: at("1000")}, "999", false},
		{"nothing seen yet", Facts{Counter: at("5")}, "", false},
		{"no counter yet", Facts{}, "120", false},
		{"a slot counter past the mark", Facts{Counter: at("100"), SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{1: at("130")}}, "120", false},
		{"every slot counter below the mark", Facts{Counter: at("100"), SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{1: at("110"), 2: at("90")}}, "120", true},
		{"a version that is not a number", Facts{Counter: at("x1")}, "120", false},
	}
	for _, c := range cases {
		if got := CacheCovers(c.f, c.seen); got != c.want {
			t.Errorf("%s: CacheCovers = %v, want %v", c.name, got, c.want)
		}
	}
}

// A plan that writes a new holder's Held on a cache that covers the
// counters may still rest on a request whose Held status was stored after
// them (a status writer's write in flight across its replica's next
// swap): one the plan ends, or one skipped over in FIFO order. Those
// passes list the resource's grants directly; the common handoff (the
// old holder Held in the cache, waiters behind the new one) does not.
func TestMayHideLateHeld(t *testing.T) {
	// The counter names b (fence 2); b's Held is not written yet.
	heldB := held(grant("b", 1, 30), 2, 32)
	cases := []struct {
		name   string
		grants func() []lockingv1alpha1.LockGrant
		want   bool
	}{
		{"the old holder Held and released, a waiter behind b", func() []lockingv1alpha1.LockGrant {
			a := held(grant("a", 0, 30), 1, 31)
			a.Spec.Release = true
			return []lockingv1alpha1.LockGrant{a, grant("b", 1, 30), grant("c", 2, 30)}
		}, false},
		{"a request before b in FIFO order, not granted", func() []lockingv1alpha1.LockGrant {
			return []lockingv1alpha1.LockGrant{grant("a", 0, 30), grant("b", 1, 30)}
		}, true},
		{"a request after b that the plan ends (withdrawn)", func() []lockingv1alpha1.LockGrant {
			a := grant("a", 2, 30)
			a.Spec.Release = true
			return []lockingv1alpha1.LockGrant{grant("b", 1, 30), a}
		}, true},
		{"b already Held: nothing newly held", func() []lockingv1alpha1.LockGrant {
			return []lockingv1alpha1.LockGrant{grant("a", 0, 30), heldB}
		}, false},
	}
	for _, c := range cases {
		f := Facts{Now: sec(2), Resource: res, Counter: counter(2, &heldB), Grants: c.grants()}
		p := Decide(f)
		if got := MayHideLateHeld(f, p); got != c.want {
			t.Errorf("%s: MayHideLateHeld = %v, want %v (newly held %v)", c.name, got, c.want, NewlyHeld(f, p))
		}
	}
}
