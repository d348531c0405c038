package grantplan

import (
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// withSession ties g to the session Lease name (uid "lease-"+name).
func withSession(g lockingv1alpha1.LockGrant, name string) lockingv1alpha1.LockGrant {
	g.Spec.Session = &lockingv1alpha1.SessionRef{Name: name, UID: "lease-" + name}
	return g
}

// session is a Lease of owner, 5 s long, last seen changing at observed s.
func session(name, owner string, observed float64) *fencing.Session {
	return &fencing.Session{UID: "lease-" + name, Holder: owner, Duration: 5 * time.Second, ObservedAt: sec(observed)}
}

func TestDecideDeadWaiterIsWithdrawnAndTheNextLiveOneGranted(t *testing.T) {
	a := held(grant("a", 0, 20), 1, 20)
	a.Spec.Release = true
	dead := withSession(grant("dead", 1, 20), "s-dead")
	live := withSession(grant("live", 2, 20), "s-live")
	p := Decide(Facts{Now: sec(8), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, dead, live},
		Sessions: map[string]*fencing.Session{
			"s-dead": session("s-dead", "owner-dead", 1.5), // last change seen at 1.5 s: lapsed at 7.5 s
			"s-live": session("s-live", "owner-live", 7),
		}})
	if len(p.Granted) == 0 || p.Granted[0].Name != "live" || p.Counter.Fence != 2 {
		t.Fatalf("granted %v with counter %+v, want live with fence 2", p.Granted, p.Counter)
	}
	d := statusOf(p, "dead")
	if d == nil || d.Phase != lockingv1alpha1.PhaseReleased || d.FenceToken != 0 {
		t.Fatalf("dead = %+v, want Released without a fence", d)
	}
	if r := readyReason(d); r != lockingv1alpha1.LockGrantReasonSessionExpired {
		t.Fatalf("dead's Ready reason = %q, want %s", r, lockingv1alpha1.LockGrantReasonSessionExpired)
	}
	if want := sec(13).Sub(sec(8)); p.RequeueAfter != want {
		t.Fatalf("requeueAfter = %v, want %v to the live holder's session deadline", p.RequeueAfter, want)
	}
}

// At a handoff the head whose client missed a renewal is withdrawn, and
// the next in line granted at once, instead of a grant that would hold
// until the dead client's session lapsed.
func TestDecideHeadThatMissedARenewalIsWithdrawnAtItsTurn(t *testing.T) {
	a := held(grant("a", 0, 20), 1, 20)
	a.Spec.Release = true
	late := withSession(grant("late", 1, 20), "s-late")
	live := withSession(grant("live", 2, 20), "s-live")
	p := Decide(Facts{Now: sec(10), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, late, live},
		Sessions: map[string]*fencing.Session{
			"s-late": session("s-late", "owner-late", 7.5), // renewal due at 9.67 s; its session lapses only at 13.5 s
			"s-live": session("s-live", "owner-live", 9.5),
		}})
	if len(p.Granted) == 0 || p.Granted[0].Name != "live" || p.Counter.Fence != 2 {
		t.Fatalf("granted %v with counter %+v, want live with fence 2", p.Granted, p.Counter)
	}
	if s := statusOf(p, "late"); s == nil || s.Phase != lockingv1alpha1.PhaseReleased || s.FenceToken != 0 || readyReason(s) != lockingv1alpha1.LockGrantReasonSessionExpired {
		t.Fatalf("late = %+v, want Released (SESSION_EXPIRED) without a fence", s)
	}
}

func TestDecideSlowButAliveWaiterKeepsItsPlace(t *testing.T) {
	slow := withSession(grant("slow", 1, 20), "s")
	other := grant("other", 2, 20)
	a := held(grant("a", 0, 20), 1, 20)
	facts := Facts{Now: sec(6.9), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, slow, other},
		Sessions: map[string]*fencing.Session{"s": session("s", "owner-slow", 1)}}
	p := Decide(facts)
	if s := statusOf(p, "slow"); s == nil || s.Phase != lockingv1alpha1.PhasePending || *s.QueuePosition != 0 {
		t.Fatalf("slow = %+v, want Pending at the head of the queue until its session lapses at 7 s", s)
	}
	if want := 100 * time.Millisecond; p.RequeueAfter.Round(time.Millisecond) != want {
		t.Fatalf("requeueAfter = %v, want %v: the session's lapse", p.RequeueAfter, want)
	}
}

func TestDecideHolderWhoseSessionLapsedEndsAndKeepsItsFence(t *testing.T) {
	a := withSession(held(grant("a", 0, 30), 4, 30), "s")
	b := grant("b", 1, 30)
	p := Decide(Facts{Now: sec(12), Resource: res, Counter: counter(4, &a), Grants: []lockingv1alpha1.LockGrant{a, b},
		Sessions: map[string]*fencing.Session{"s": session("s", "owner-a", 6)}})
	if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired || s.FenceToken != 4 || readyReason(s) != lockingv1alpha1.LockGrantReasonSessionExpired {
		t.Fatalf("a = %+v, want Expired (SESSION_EXPIRED) with fence 4", s)
	}
	if len(p.Granted) == 0 || p.Granted[0].Name != "b" || p.Counter.Fence != 5 {
		t.Fatalf("granted %v, counter %+v; want b with fence 5", p.Granted, p.Counter)
	}
}

func TestDecideSessionMustBeTheOwnersAndTheSameLease(t *testing.T) {
	for name, s := range map[string]*fencing.Session{
		"gone":           nil,
		"replaced":       {UID: "another", Holder: "owner-w", Duration: 5 * time.Second, ObservedAt: sec(1)},
		"someone else's": session("s", "mallory", 1),
	} {
		t.Run(name, func(t *testing.T) {
			w := withSession(grant("w", 0, 20), "s")
			p := Decide(Facts{Now: sec(1), Resource: res, Grants: []lockingv1alpha1.LockGrant{w}, Sessions: map[string]*fencing.Session{"s": s}})
			if len(p.Granted) != 0 {
				t.Fatalf("granted %s; a request without its own live session must never be granted", p.Granted[0].Name)
			}
			if st := statusOf(p, "w"); st == nil || st.Phase != lockingv1alpha1.PhaseReleased {
				t.Fatalf("w = %+v, want Released", st)
			}
		})
	}
}

func TestDecideRequestWithoutSessionWaitsAsBefore(t *testing.T) {
	a := held(grant("a", 0, 20), 1, 20)
	w := grant("w", 1, 20)
	p := Decide(Facts{Now: sec(100), Resource: res, Counter: counter(1, &a), Grants: []lockingv1alpha1.LockGrant{a, w}})
	if len(p.Granted) == 0 || p.Granted[0].Name != "w" {
		t.Fatalf("granted %v, want w once a expired", p.Granted)
	}
}

func readyReason(s *lockingv1alpha1.LockGrantStatus) string {
	for _, c := range s.Conditions {
		if c.Type == lockingv1alpha1.ConditionReady {
			return c.Reason
		}
	}
	return ""
}

func TestDecideHeldGrantNoLongerTheHolderKeepsItsSessionReason(t *testing.T) {
	// The counter already moved to b (the status write of a's end was lost).
	a := withSession(held(grant("a", 0, 30), 4, 30), "s")
	b := held(grant("b", 1, 30), 5, 40)
	p := Decide(Facts{Now: sec(12), Resource: res, Counter: counter(5, &b), Grants: []lockingv1alpha1.LockGrant{a, b},
		Sessions: map[string]*fencing.Session{"s": session("s", "owner-a", 6)}})
	if s := statusOf(p, "a"); s == nil || s.Phase != lockingv1alpha1.PhaseExpired || readyReason(s) != lockingv1alpha1.LockGrantReasonSessionExpired {
		t.Fatalf("a = %+v, want Expired with reason SESSION_EXPIRED", s)
	}
}
