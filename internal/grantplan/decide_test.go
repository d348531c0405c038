package grantplan

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

var t0 = time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)

func sec(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

const res = "invoice-batch/2026-07-19"

// grant is a LockGrant requested at t=requested seconds.
func grant(name string, requested float64, ttl int32) lockingv1alpha1.LockGrant {
	return lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: sec(requested).Format(time.RFC3339Nano)},
		},
		Spec: lockingv1alpha1.LockGrantSpec{Resource: res, Owner: "owner-" + name, LeaseDurationSeconds: ttl},
	}
}

func held(g lockingv1alpha1.LockGrant, fence int64, expires float64) lockingv1alpha1.LockGrant {
	e := metav1.NewMicroTime(sec(expires))
	g.Status.Phase, g.Status.FenceToken, g.Status.ExpiresAt = lockingv1alpha1.PhaseHeld, fence, &e
	return g
}

func counter(fence int64, holder *lockingv1alpha1.LockGrant) *lockingv1alpha1.FenceCounter {
	c := &lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Resource: res, Fence: fence}}
	if holder != nil {
		c.Spec.Holder = &lockingv1alpha1.FenceHolder{Name: holder.Name, UID: string(holder.UID), Owner: holder.Spec.Owner, Fence: fence}
		if e := holder.Status.ExpiresAt; e != nil {
			c.Spec.Holder.ExpiresAt = lockingv1alpha1.FormatInstant(e.Time)
		}
	}
	return c
}

// legacyCounter is a counter written before counters carried the lease.
func legacyCounter(fence int64, holder *lockingv1alpha1.LockGrant) *lockingv1alpha1.FenceCounter {
	c := counter(fence, holder)
	if c.Spec.Holder != nil {
		c.Spec.Holder.ExpiresAt = ""
	}
	return c
}

func statusOf(p Plan, name string) *lockingv1alpha1.LockGrantStatus {
	for _, g := range p.Statuses {
		if g.Name == name {
			return &g.Status
		}
	}
	return nil
}

func TestDecideGrantsFIFOWithNextFence(t *testing.T) {
	// Listed out of order; b was requested first.
	p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(7, nil), Grants: []lockingv1alpha1.LockGrant{grant("c", 0.3, 5), grant("b", 0.1, 5), grant("d", 0.2, 5)}})
	if p.Counter == nil || p.Counter.Fence != 8 || p.Counter.Holder.Name != "b" {
		t.Fatalf("counter = %+v, want fence 8 held by b", p.Counter)
	}
	if p.Statuses[0].Name != "b" {
		t.Fatalf("first status write is %s, want the new holder b", p.Statuses[0].Name)
	}
	b := statusOf(p, "b")
	if b.Phase != lockingv1alpha1.PhaseHeld || b.FenceToken != 8 || !b.ExpiresAt.Time.Equal(sec(6)) {
		t.Fatalf("b = %+v, want Held fence 8 until t=6", b)
	}
	for name, pos := range map[string]int32{"d": 0, "c": 1} {
		if s := statusOf(p, name); s.Phase != lockingv1alpha1.PhasePending || *s.QueuePosition != pos {
			t.Fatalf("%s = %+v, want Pending at %d", name, s, pos)
		}
	}
	if p.RequeueAfter != 5*time.Second {
		t.Fatalf("requeueAfter = %v, want the 5s to b's expiry", p.RequeueAfter)
	}
}

func TestDecideExpiryIsAtExpiresAt(t *testing.T) {
	a := held(grant("a", 0, 5), 1, 5)
	b := grant("b", 1, 5)
	p := Decide(Facts{Now: sec(5), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, b}})
	if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired {
		t.Fatalf("a at t=5 = %+v, want Expired", s)
	}
	if p.Counter == nil || p.Counter.Fence != 2 || p.Counter.Holder.Name != "b" {
		t.Fatalf("counter = %+v, want fence 2 held by b", p.Counter)
	}
	p = Decide(Facts{Now: sec(4.999), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, b}})
	if p.Counter != nil || statusOf(p, "a") != nil {
		t.Fatalf("at t=4.999 the plan changes the holder: %+v", p)
	}
}

func TestDecideRenew(t *testing.T) {
	a := held(grant("a", 0, 5), 1, 5)
	a.Spec.Renewals = 1
	p := Decide(Facts{Now: sec(4), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
	s := statusOf(p, "a")
	if s == nil || s.Phase != lockingv1alpha1.PhaseHeld || !s.ExpiresAt.Time.Equal(sec(9)) || s.FenceToken != 1 || s.ObservedRenewals != 1 {
		t.Fatalf("renew at 4 = %+v, want Held fence 1 until 9", s)
	}
	// A renew that arrives after expiry fails and never re-acquires.
	p = Decide(Facts{Now: sec(5.5), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
	s = statusOf(p, "a")
	if s == nil || s.Phase != lockingv1alpha1.PhaseExpired || s.ObservedRenewals != 1 {
		t.Fatalf("late renew = %+v, want Expired with the renew answered", s)
	}
	if c := findCond(s, lockingv1alpha1.ConditionRenewed); c == nil || c.Status != metav1.ConditionFalse || c.Reason != lockingv1alpha1.LockGrantReasonExpired {
		t.Fatalf("Renewed condition = %+v, want False/EXPIRED", c)
	}
	if p.Counter == nil || p.Counter.Holder != nil || p.Counter.Fence != 1 {
		t.Fatalf("counter = %+v, want freed at fence 1", p.Counter)
	}
}

// A renew that lost the race to the release is answered ALREADY_ENDED on
// the Renewed condition, not EXPIRED: the lease had not run out.
func TestDecideRenewMeetsRelease(t *testing.T) {
	a := held(grant("a", 0, 5), 1, 5)
	a.Spec.Renewals, a.Spec.Release = 1, true
	s := statusOf(Decide(Facts{Now: sec(4), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}}), "a")
	if s == nil || s.Phase != lockingv1alpha1.PhaseReleased || s.ObservedRenewals != 1 {
		t.Fatalf("renew with release = %+v, want Released with the renew answered", s)
	}
	if c := findCond(s, lockingv1alpha1.ConditionRenewed); c == nil || c.Status != metav1.ConditionFalse || c.Reason != lockingv1alpha1.LockGrantReasonAlreadyEnded {
		t.Fatalf("Renewed condition = %+v, want False/ALREADY_ENDED", c)
	}
}

func TestDecideTimedOutWaiterIsNeverGranted(t *testing.T) {
	p1 := held(grant("p1", 0, 20), 1, 20)
	p2 := grant("p2", 0.1, 5)
	p2.Spec.WaitTimeoutSeconds = 5
	p := Decide(Facts{Now: sec(20), Resource: res, Counter: counter(1, &p1), Grants: []lockingv1alpha1.LockGrant{p1, p2}})
	if s := statusOf(p, "p2"); s == nil || s.Phase != lockingv1alpha1.PhaseTimedOut {
		t.Fatalf("p2 = %+v, want TimedOut", s)
	}
	if p.Counter == nil || p.Counter.Holder != nil {
		t.Fatalf("counter = %+v, want the resource free, not granted to p2", p.Counter)
	}
}

func TestDecideConvergesAfterCrashBetweenWrites(t *testing.T) {
	// The counter names b with fence 4, but b's status was never written.
	b := grant("b", 1, 10)
	p := Decide(Facts{Now: sec(3), Resource: res, Counter: counter(4, &b), Grants: []lockingv1alpha1.LockGrant{b, grant("c", 2, 10)}})
	if p.Counter != nil {
		t.Fatalf("counter rewritten to %+v; the crash must not issue a second fence", p.Counter)
	}
	if s := statusOf(p, "b"); s == nil || s.Phase != lockingv1alpha1.PhaseHeld || s.FenceToken != 4 {
		t.Fatalf("b = %+v, want Held with the counter's fence 4", s)
	}
}

func TestDecideHeldGrantThatIsNotTheHolderEnds(t *testing.T) {
	a := held(grant("a", 0, 10), 1, 10)
	a.Spec.Release = true
	b := held(grant("b", 1, 10), 2, 12)
	p := Decide(Facts{Now: sec(3), Resource: res, Counter: counter(2, &b), Grants: []lockingv1alpha1.LockGrant{a, b}})
	if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("a = %+v, want Released", s)
	}
	if p.Counter != nil {
		t.Fatalf("counter changed: %+v", p.Counter)
	}
}

func TestDecideDeletedHolderFreesTheResource(t *testing.T) {
	gone := grant("gone", 0, 10)
	next := grant("next", 1, 10)
	p := Decide(Facts{Now: sec(2), Resource: res, Counter: counter(3, &gone), Grants: []lockingv1alpha1.LockGrant{next}})
	if p.Counter == nil || p.Counter.Fence != 4 || p.Counter.Holder.Name != "next" {
		t.Fatalf("counter = %+v, want fence 4 held by next", p.Counter)
	}
}

func findCond(s *lockingv1alpha1.LockGrantStatus, t string) *metav1.Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			return &s.Conditions[i]
		}
	}
	return nil
}

func TestDecideDeletesFinishedGrantsAfterRetention(t *testing.T) {
	old := grant("old", 0, 5)
	ended := metav1.NewMicroTime(sec(10))
	old.Status.Phase, old.Status.EndedAt = lockingv1alpha1.PhaseReleased, &ended
	f := Facts{Now: sec(70), Retention: time.Minute, Resource: res, Counter: counter(1, nil), Grants: []lockingv1alpha1.LockGrant{old}}
	if p := Decide(f); len(p.Deletes) != 1 || p.Deletes[0].Name != "old" {
		t.Fatalf("deletes at retention end = %v, want old", p.Deletes)
	}
	f.Now = sec(40)
	if p := Decide(f); len(p.Deletes) != 0 || p.RequeueAfter != 30*time.Second {
		t.Fatalf("before retention end: deletes %v, requeue %v; want none, 30s", p.Deletes, p.RequeueAfter)
	}
	f.Retention = 0
	if p := Decide(f); len(p.Deletes) != 0 {
		t.Fatal("retention 0 must keep finished grants")
	}
}

// The pass that ends a grant asks for the pass that deletes it when its
// retention has passed: no other event may ever come for the resource (the
// replica that wrote the final status starts no pass for its own write).
func TestDecideAsksForThePassThatDeletesAGrantItEnds(t *testing.T) {
	a := held(grant("a", 0, 30), 1, 30)
	a.Spec.Release = true
	p := Decide(Facts{Now: sec(5), Retention: time.Minute, Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a}})
	if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseReleased || s.EndedAt == nil {
		t.Fatalf("status after the release = %+v, want Released with an end", s)
	}
	if p.RequeueAfter != time.Minute {
		t.Fatalf("requeue after the release = %v, want the retention, 1m0s", p.RequeueAfter)
	}
}

func TestDecideRaisesFenceRegressionReportedByTheHolder(t *testing.T) {
	a := held(grant("a", 0, 10), 3, 10)
	a.Annotations[lockingv1alpha1.FenceRegressionAnnotation] = "fence 3 was accepted from another grant"
	p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(3, &a), Grants: []lockingv1alpha1.LockGrant{a}})
	s := statusOf(p, "a")
	if s == nil {
		t.Fatal("no status change for the reported regression")
	}
	if c := findCond(s, lockingv1alpha1.ConditionFenceRegression); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "FenceRegression" {
		t.Fatalf("FenceRegression condition = %+v", c)
	}
	if len(p.Events) != 1 || !p.Events[0].Warning || p.Events[0].Reason != "FenceRegression" {
		t.Fatalf("events = %+v, want one FenceRegression warning", p.Events)
	}
	// Raised once: the next pass changes nothing.
	a.Status = *s
	if p := Decide(Facts{Now: sec(2), Resource: res, Counter: counter(3, &a), Grants: []lockingv1alpha1.LockGrant{a}}); len(p.Statuses) != 0 || len(p.Events) != 0 {
		t.Fatalf("second pass = %d statuses, %d events; want none", len(p.Statuses), len(p.Events))
	}
}

func TestEqualStatusSeesEveryField(t *testing.T) {
	g := held(grant("a", 0, 5), 1, 5)
	setCond(&g, lockingv1alpha1.ConditionReady, metav1.ConditionTrue, "Granted", "m", metav1.NewMicroTime(sec(0)))
	base := g.Status
	pos := int32(2)
	mutations := map[string]func(*lockingv1alpha1.LockGrantStatus){
		"phase":     func(s *lockingv1alpha1.LockGrantStatus) { s.Phase = lockingv1alpha1.PhaseExpired },
		"fence":     func(s *lockingv1alpha1.LockGrantStatus) { s.FenceToken++ },
		"queue":     func(s *lockingv1alpha1.LockGrantStatus) { s.QueuePosition = &pos },
		"expiresAt": func(s *lockingv1alpha1.LockGrantStatus) { e := metav1.NewMicroTime(sec(6)); s.ExpiresAt = &e },
		"endedAt":   func(s *lockingv1alpha1.LockGrantStatus) { e := metav1.NewMicroTime(sec(6)); s.EndedAt = &e },
		"renewals":  func(s *lockingv1alpha1.LockGrantStatus) { s.ObservedRenewals++ },
		"proof":     func(s *lockingv1alpha1.LockGrantStatus) { s.Proof = "lgv1.x.y" },
		"record":    func(s *lockingv1alpha1.LockGrantStatus) { s.Record = &lockingv1alpha1.GrantRecord{FenceToken: 1} },
		"condition": func(s *lockingv1alpha1.LockGrantStatus) {
			s.Conditions = append(s.Conditions, metav1.Condition{Type: "X"})
		},
		"lastRenewal": func(s *lockingv1alpha1.LockGrantStatus) { e := metav1.NewMicroTime(sec(1)); s.LastRenewTime = &e },
	}
	for name, mutate := range mutations {
		changed := *base.DeepCopy()
		mutate(&changed)
		if equalStatus(&base, &changed) {
			t.Errorf("a change of %s went unnoticed", name)
		}
	}
	same := *base.DeepCopy()
	if !equalStatus(&base, &same) {
		t.Error("a copy differs")
	}
}

// queued is a request that has been waiting since t=requested, with the
// queue position it was given when it joined.
func queued(name string, requested float64, pos int32) lockingv1alpha1.LockGrant {
	g := grant(name, requested, 5)
	g.Status.Phase, g.Status.QueuePosition = lockingv1alpha1.PhasePending, &pos
	setReady(&g, metav1.ConditionFalse, lockingv1alpha1.LockGrantReasonPending, "Waiting in the queue for the resource", metav1.NewMicroTime(sec(requested)))
	return g
}

// A handoff writes the released holder, the new holder and the new head of
// the queue, whatever the queue's length: positions are written when a
// request joins and when it becomes next, not moved for every waiter.
func TestHandoffWritesDoNotGrowWithTheQueue(t *testing.T) {
	for _, waiting := range []int{1, 8, 200} {
		a := held(grant("a", 0, 60), 1, 60)
		a.Spec.Release = true
		grants := []lockingv1alpha1.LockGrant{a}
		for i := range waiting {
			grants = append(grants, queued(fmt.Sprintf("w%03d", i), 1+float64(i)/1000, int32(i)))
		}
		p := Decide(Facts{Now: sec(2), Resource: res, Counter: counter(1, &a), Grants: grants})
		if len(p.Granted) != 1 || p.Granted[0].Name != "w000" || p.Counter.Fence != 2 {
			t.Fatalf("%d waiting: granted %v, counter %+v; want w000 with fence 2", waiting, p.Granted, p.Counter)
		}
		want := 3 // a Released, w000 Held, w001 next
		if waiting == 1 {
			want = 2
		}
		if len(p.Statuses) != want {
			names := []string{}
			for _, g := range p.Statuses {
				names = append(names, g.Name)
			}
			t.Fatalf("%d waiting: %d status writes %v, want %d", waiting, len(p.Statuses), names, want)
		}
		if waiting > 1 {
			if s := statusOf(p, "w001"); s == nil || *s.QueuePosition != 0 {
				t.Fatalf("%d waiting: the new head's status = %+v, want position 0", waiting, s)
			}
		}
	}
}
