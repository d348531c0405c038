package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// newSession creates a session Lease of holder in ns, ttl seconds long, as a
// client process would (pkg/lock.Session).
func newSession(t *testing.T, ns, holder string, ttl int32, labeled bool) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "session-"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(ttl)},
	}
	if labeled {
		l.Labels = map[string]string{lockingv1alpha1.SessionLabel: "true"}
	}
	if err := admin.Create(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	return l
}

// renewSession renews l, as its client's keeper does.
func renewSession(t *testing.T, l *coordinationv1.Lease) {
	t.Helper()
	body := fmt.Sprintf(`{"spec":{"renewTime":%q}}`, metav1.NewMicroTime(time.Now()).Format("2006-01-02T15:04:05.000000Z07:00"))
	if err := admin.Patch(t.Context(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
		t.Fatal(err)
	}
}

// waitObserved waits until the manager's informer shows l as it is now,
// so that the manager sees the renewal at the clock's present time, or at
// the latest in the next pass over a grant under it.
func waitObserved(t *testing.T, l *coordinationv1.Lease) {
	t.Helper()
	cur := &coordinationv1.Lease{}
	if err := admin.Get(t.Context(), client.ObjectKeyFromObject(l), cur); err != nil {
		t.Fatal(err)
	}
	seen := &coordinationv1.Lease{}
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Cache.Get(ctx, client.ObjectKeyFromObject(l), seen); err != nil {
			return false, err
		}
		return seen.ResourceVersion == cur.ResourceVersion, nil
	})
	if err != nil {
		t.Fatalf("the manager never saw session %s at version %s: %v", l.Name, cur.ResourceVersion, err)
	}
}

// probe makes a request for the resource and waits for it to be queued:
// the pass that queues it decides the resource at the clock's present
// time, and the statuses it writes before the probe's are stored by then.
func probe(t *testing.T, ns string) {
	t.Helper()
	g, err := acquire(t, as(t, "probe"), ns, 30)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, g, lockingv1alpha1.PhasePending)
}

func under(l *coordinationv1.Lease) func(*lockingv1alpha1.LockGrant) {
	return func(g *lockingv1alpha1.LockGrant) {
		g.Spec.Session = &lockingv1alpha1.SessionRef{Name: l.Name, UID: string(l.UID)}
	}
}

func readyReasonOf(g *lockingv1alpha1.LockGrant) string {
	if c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// The reproduction: a waiter whose client died while queued is
// ahead of a live one. The dead request is never granted and never gets a
// fence; the live waiter holds within 2 s of the holder's release.
func TestDeadWaiterAheadOfALiveOneIsNeverGranted(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquire(t, as(t, "a"), ns, 20)

	deadSession := newSession(t, ns, as(t, "dead").name, 5, true)
	dead, err := acquire(t, as(t, "dead"), ns, 20, under(deadSession))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, dead, "first in the queue", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.QueuePosition != nil && *g.Status.QueuePosition == 0
	})
	tl.at(0.5)
	liveSession := newSession(t, ns, as(t, "live").name, 5, true)
	live, err := acquire(t, as(t, "live"), ns, 20, under(liveSession))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, live, "second in the queue", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.QueuePosition != nil && *g.Status.QueuePosition == 1
	})

	// Eight seconds pass: the dead waiter's client renews nothing (its
	// session lapses at 6 s), the live one goes on renewing.
	tl.at(8)
	renewSession(t, liveSession)

	released := time.Now()
	if err := release(t, as(t, "a"), a); err != nil {
		t.Fatal(err)
	}
	got := waitPhase(t, live, lockingv1alpha1.PhaseHeld)
	if took := time.Since(released); took > 2*time.Second {
		t.Fatalf("the live waiter held %s after the release; want within 2 s", took)
	}
	if got.Status.FenceToken != a.Status.FenceToken+1 {
		t.Fatalf("the live waiter got fence %d, want %d", got.Status.FenceToken, a.Status.FenceToken+1)
	}
	d := waitFor(t, dead, "ended", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase.Final() })
	if d.Status.Phase != lockingv1alpha1.PhaseReleased || d.Status.FenceToken != 0 || readyReasonOf(d) != fencing.ReasonSessionExpired.ConditionReason() {
		t.Fatalf("the dead waiter's request is %s (reason %s) with fence %d; want Released (SessionExpired), never fenced", d.Status.Phase, readyReasonOf(d), d.Status.FenceToken)
	}
	if c := counterOf(t, ns); c.Spec.Fence != got.Status.FenceToken {
		t.Fatalf("counter at fence %d, want %d: a withdrawn request consumed a fence", c.Spec.Fence, got.Status.FenceToken)
	}
}

// A waiter that renews its session on its cadence keeps its place however
// long it waits, and is granted at its turn. A grant ends when its session
// lapses (duration + 1 s margin after the last renewal the controller
// saw), not when a renewal is late: its fence is consumed, and the next
// waiter gets a larger one.
func TestWaiterRenewingItsSessionKeepsItsPlace(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquire(t, as(t, "a"), ns, 30)
	s := newSession(t, ns, as(t, "slow").name, 5, true)
	slow, err := acquire(t, as(t, "slow"), ns, 30, under(s))
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, slow, lockingv1alpha1.PhasePending)
	tl.at(0.1)
	next, err := acquire(t, as(t, "next"), ns, 30)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, next, lockingv1alpha1.PhasePending)

	// Renewed every 1.5 s: still first after 5.9 s in line.
	for _, at := range []float64{1.5, 3, 4.5} {
		tl.at(at)
		renewSession(t, s)
		waitObserved(t, s)
	}
	tl.at(5.9)
	if err := release(t, as(t, "a"), a); err != nil {
		t.Fatal(err)
	}
	held := waitPhase(t, slow, lockingv1alpha1.PhaseHeld)
	if held.Status.FenceToken != a.Status.FenceToken+1 {
		t.Fatalf("slow got fence %d, want %d", held.Status.FenceToken, a.Status.FenceToken+1)
	}

	// It keeps its grant past its cadence (a renewal due at 6.2 + 5/3 +
	// 0.5 s), until its session lapses (6.2 + 5 + 1 s, or later if the
	// manager saw the renewal later).
	tl.at(6.2)
	renewSession(t, s)
	waitObserved(t, s)
	tl.at(11)
	probe(t, ns)
	if g := get(t, slow); g.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("slow is %s 4.8 s after its last renewal; it holds until its session lapses", g.Status.Phase)
	}
	tl.at(20)
	wake(t, next)
	ended := waitPhase(t, slow, lockingv1alpha1.PhaseExpired)
	if readyReasonOf(ended) != fencing.ReasonSessionExpired.ConditionReason() || ended.Status.FenceToken != held.Status.FenceToken {
		t.Fatalf("slow ended with reason %s and fence %d; want SessionExpired and fence %d", readyReasonOf(ended), ended.Status.FenceToken, held.Status.FenceToken)
	}
	n := waitPhase(t, next, lockingv1alpha1.PhaseHeld)
	if n.Status.FenceToken != held.Status.FenceToken+1 {
		t.Fatalf("next got fence %d, want %d", n.Status.FenceToken, held.Status.FenceToken+1)
	}
	// The ended grant's writes are refused.
	wantReason(t, "a write under the ended grant", write(t, as(t, "slow"), ns, "slow-write", ended, fenceOf(ended), "late"), string(fencing.ReasonStaleOwner))
}

// At a handoff, the head whose client missed its session's renewal is
// withdrawn without a fence, and the next in line granted at once, though
// the session has not lapsed yet.
func TestHeadThatMissedItsRenewalIsWithdrawnAtItsTurn(t *testing.T) {
	ns := namespace(t)
	tl := startTimeline()
	a := mustAcquire(t, as(t, "a"), ns, 30)
	s := newSession(t, ns, as(t, "late").name, 5, true)
	late, err := acquire(t, as(t, "late"), ns, 30, under(s))
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, late, lockingv1alpha1.PhasePending)
	// Requested later by the manager's clock, which stamps the queue
	// order: two requests at one instant are ordered by UID.
	tl.at(0.1)
	next, err := acquire(t, as(t, "next"), ns, 30)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, next, lockingv1alpha1.PhasePending)

	tl.at(2.3)
	if err := release(t, as(t, "a"), a); err != nil {
		t.Fatal(err)
	}
	if n := waitPhase(t, next, lockingv1alpha1.PhaseHeld); n.Status.FenceToken != a.Status.FenceToken+1 {
		t.Fatalf("next got fence %d, want %d", n.Status.FenceToken, a.Status.FenceToken+1)
	}
	l := waitFor(t, late, "ended", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase.Final() })
	if l.Status.Phase != lockingv1alpha1.PhaseReleased || l.Status.FenceToken != 0 || readyReasonOf(l) != fencing.ReasonSessionExpired.ConditionReason() {
		t.Fatalf("late is %s (reason %s) with fence %d; want Released (SessionExpired) without a fence", l.Status.Phase, readyReasonOf(l), l.Status.FenceToken)
	}
}

// A request may name only a session Lease of its own requester, and never
// change it.
func TestSessionAdmission(t *testing.T) {
	ns := namespace(t)
	me := as(t, "me")
	mine := newSession(t, ns, me.name, 5, true)
	cases := []struct {
		name string
		ref  *lockingv1alpha1.SessionRef
		want string
	}{
		{"a Lease that does not exist", &lockingv1alpha1.SessionRef{Name: "nope", UID: "x"}, string(fencing.ReasonSessionExpired)},
		{"another Lease under the same name", &lockingv1alpha1.SessionRef{Name: mine.Name, UID: "another-uid"}, string(fencing.ReasonSessionExpired)},
		{"someone else's session", func() *lockingv1alpha1.SessionRef {
			l := newSession(t, ns, as(t, "other").name, 5, true)
			return &lockingv1alpha1.SessionRef{Name: l.Name, UID: string(l.UID)}
		}(), string(fencing.ReasonNotOwner)},
		{"a Lease that is not a session", func() *lockingv1alpha1.SessionRef {
			l := newSession(t, ns, me.name, 5, false)
			return &lockingv1alpha1.SessionRef{Name: l.Name, UID: string(l.UID)}
		}(), "INVALID_SPEC"},
	}
	for _, c := range cases {
		_, err := acquire(t, me, ns, 10, func(g *lockingv1alpha1.LockGrant) { g.Spec.Session = c.ref })
		wantReason(t, c.name, err, c.want)
	}

	g, err := acquire(t, me, ns, 10, under(mine))
	if err != nil {
		t.Fatalf("a request under the requester's own session: %v", err)
	}
	other := newSession(t, ns, me.name, 5, true)
	err = patchGrant(t, me, g, map[string]any{"session": map[string]any{"name": other.Name, "uid": other.UID}})
	wantReason(t, "moving a request to another session", err, "INVALID_SPEC")
}
