package sim

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// script drives the simulation's enforcement point by hand: grants are
// created and reconciled directly, and each request is delivered and
// answered before the next.
type script struct {
	t *testing.T
	w *world
	n int
}

func newScript(t *testing.T) *script {
	w := newWorld(1, nil)
	w.horizon = time.Hour
	return &script{t: t, w: w}
}

// advance moves the clock by d and runs a controller pass.
func (s *script) advance(d time.Duration) {
	target := s.w.s.now + d
	s.w.s.run(target)
	s.w.s.now = target // run stops at the last event before it
	s.w.reconcile(s.w.resource)
	s.w.s.run(s.w.s.now + 100*time.Millisecond)
}

// acquire creates a grant of owner with a lease of ttl seconds and returns
// a sender holding it once the controller has made it Held.
func (s *script) acquire(owner string, ttl int32) sender {
	s.t.Helper()
	s.n++
	g := s.w.reg.create(owner, s.w.resource, ttl, fmt.Sprintf("req-%d", s.n), s.w.s.now)
	s.advance(10 * time.Millisecond)
	g = s.w.reg.grants[g.UID]
	if g.Status.Phase != lockingv1alpha1.PhaseHeld {
		s.t.Fatalf("grant of %s is %s, not Held", owner, g.Status.Phase)
	}
	return sender{caller: owner, uid: g.UID, fence: g.Status.FenceToken, proof: fencing.Proof(g.Status.Proof)}
}

// send delivers m and returns the reason it was refused ("" when accepted)
// and the version it made.
func (s *script) send(m writeMsg) (fencing.Reason, int64) {
	var reason fencing.Reason = "no answer"
	var rv int64
	m.onAnswer = func(ok bool, r fencing.Reason, v int64) {
		reason, rv = r, v
		if ok {
			reason = ""
		}
	}
	s.w.deliver(m)
	s.w.s.run(s.w.s.now + time.Second)
	return reason, rv
}

func (s *script) expect(what string, m writeMsg, want fencing.Reason) int64 {
	s.t.Helper()
	got, rv := s.send(m)
	if got != want {
		s.t.Errorf("%s: got %q, want %q", what, got, want)
	}
	return rv
}

func (s *script) clean() {
	s.t.Helper()
	if r := s.w.rep; r.Forbidden() != 0 {
		s.t.Fatalf("the oracle found violations: %s", r)
	}
}

const (
	identityA = "system:serviceaccount:billing:a"
	identityB = "system:serviceaccount:billing:b"
)

// The ways around a guarded object, through the simulation's enforcement
// point: replicas of one identity, writes that assert nothing, a record the
// guard never wrote, subresources and deletes.
func TestWaysAroundAGuardedObject(t *testing.T) {
	t.Run("a superseded replica of the holder's identity", func(t *testing.T) {
		s := newScript(t)
		obj := s.w.resource
		a1 := s.acquire(identityA, 2)
		s.expect("A1 stamps", a1.stamped(obj, "A1"), "")
		s.advance(3 * time.Second) // A1's lease lapses
		a2 := s.acquire(identityA, 30)
		if a2.fence != a1.fence+1 {
			t.Fatalf("A2 got fence %d after %d", a2.fence, a1.fence)
		}
		s.expect("A2 stamps", a2.stamped(obj, "A2"), "")
		s.expect("A1's merge patch of data only", a1.msg(fencing.OpUpdate, bodyMerge, obj, "STALE"), fencing.ReasonNoFence)
		read := *s.w.objects[obj]
		put := a1.msg(fencing.OpUpdate, bodyAsRead, obj, "STALE")
		put.read, put.precondition = &read, read.rv
		s.expect("A1's re-read and update without restamping", put, fencing.ReasonNoFence)
		s.expect("A1's bare delete", a1.msg(fencing.OpDelete, bodyNone, obj, ""), fencing.ReasonNoFence)
		s.expect("A1's own claim", a1.stamped(obj, "STALE"), fencing.ReasonStaleOwner)
		if o := s.w.objects[obj]; !o.exists || o.data != "A2" || o.record.Fence != a2.fence || !o.claim.IsZero() {
			t.Fatalf("the object changed: %+v", o)
		}
		s.expect("A2 stamps again", a2.stamped(obj, "A2 again"), "")
		s.clean()
	})

	t.Run("a look-alike's forged record does not lock the holder out", func(t *testing.T) {
		s := newScript(t)
		obj := s.w.lookalike
		b := s.acquire(identityB, 30)
		forged := sender{caller: identityA}.msg(fencing.OpCreate, bodyForged, obj, "FORGED")
		forged.forgedRecord = fencing.AcceptedOf(namespace+"/"+string(b.uid), strconv.FormatInt(math.MaxInt64, 10), "", "", "")
		forged.forgedClaim = fencing.Claim{Grant: "a1", Fence: "1"}
		s.expect("A creates it unguarded", forged, "")
		s.expect("B applies it stamped", b.stamped(obj, "B"), "")
		if o := s.w.objects[obj]; !o.guarded || o.record.Fence != b.fence || !o.claim.IsZero() {
			t.Fatalf("B's write did not put the object under guard with B's record: %+v", o)
		}
		s.expect("a merge patch after", sender{caller: identityA}.msg(fencing.OpUpdate, bodyMerge, obj, "STALE"), fencing.ReasonNoFence)
		s.clean()
	})

	t.Run("subresources", func(t *testing.T) {
		s := newScript(t)
		obj := s.w.resource
		a := s.acquire(identityA, 2)
		s.advance(3 * time.Second)
		b := s.acquire(identityB, 30)
		s.expect("B stamps", b.stamped(obj, "B"), "")
		c := sender{caller: intruder}
		scale := c.msg(fencing.OpUpdate, bodyScale, obj, "")
		scale.sub, scale.opaque = "scale", true
		s.expect("c scales", scale, fencing.ReasonNoFence)
		scale.caller, scale.uid, scale.fence = b.caller, b.uid, b.fence
		s.expect("B scales", scale, fencing.ReasonNoFence)
		status := c.msg(fencing.OpUpdate, bodyMerge, obj, "STATUS")
		status.sub = "status"
		s.expect("c patches the status", status, fencing.ReasonNoFence)
		unguard := a.msg(fencing.OpUpdate, bodyUnguard, obj, "")
		unguard.sub = "status"
		s.expect("stale A removes the guard label through the status", unguard, fencing.ReasonNoFence)
		s.expect("then an unfenced write", a.msg(fencing.OpUpdate, bodyMerge, obj, "UNFENCED"), fencing.ReasonNoFence)
		evict := c.msg(fencing.OpDelete, bodyNone, obj, "")
		evict.sub, evict.opaque = "eviction", true
		s.expect("c evicts", evict, fencing.ReasonNoFence)
		bs := b.stamped(obj, "B's status")
		bs.upsert, bs.sub = false, "status"
		s.expect("B's status write with its claim", bs, "")
		if o := s.w.objects[obj]; !o.exists || !o.guarded || o.replicas != 0 || o.status != "B's status" || o.data != "B" {
			t.Fatalf("the object is not as B left it: %+v", o)
		}
		s.clean()
	})

	t.Run("deletes", func(t *testing.T) {
		s := newScript(t)
		obj := s.w.resource
		a := s.acquire(identityA, 2)
		s.expect("A stamps", a.stamped(obj, "A"), "")
		s.advance(3 * time.Second)
		a2 := s.acquire(identityA, 30)
		rv := s.expect("A2 stamps", a2.stamped(obj, "A2"), "")
		bare := a2.msg(fencing.OpDelete, bodyNone, obj, "")
		s.expect("A2's delete without a precondition", bare, fencing.ReasonNoFence)
		under := bare
		under.precondition = rv
		s.expect("A2's delete under its version, without a pre-delete write", under, fencing.ReasonNoFence)
		pre := a.stamped(obj, "PRE-DELETE")
		pre.intent = fencing.IntentDelete
		s.expect("stale A's pre-delete write", pre, fencing.ReasonStaleOwner)
		pre2 := a2.stamped(obj, "PRE-DELETE")
		pre2.intent = fencing.IntentDelete
		rv = s.expect("A2's pre-delete write", pre2, "")
		stale := bare
		stale.precondition = rv - 1
		s.expect("a delete under an older version", stale, fencing.ReasonNoFence)
		under.precondition = rv
		s.expect("A2's delete under its pre-delete version", under, "")
		if s.w.objects[obj].exists {
			t.Fatal("the object was not deleted")
		}
		s.expect("stale A re-creates it with its own claim", a.stamped(obj, "STALE"), fencing.ReasonStaleOwner)
		s.expect("A2 re-creates it", a2.stamped(obj, "A2"), "")
		s.clean()
	})
}
