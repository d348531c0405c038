package sim

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// FaultKilledWaiter kills client processes while their requests wait in
// the queue (a rollout, an OOM kill, a CronJob's deadline): their session
// Lease stops being renewed. Some waiters are killed just before they
// would be granted, some stay alive and hold in their turn.
const FaultKilledWaiter Fault = "killed-waiter"

// sessionTTL is the session duration of the simulated clients, as
// pkg/lock's default.
const sessionTTL = 5 * time.Second

// simSession is a session Lease as the registry knows it.
type simSession struct {
	uid    string
	holder string
	// observedAt is when the controller last saw the Lease change.
	observedAt time.Duration
}

// waiterProc is a client process that waits for the contended resource
// under a session, and may be killed while it waits.
type waiterProc struct {
	w       *world
	owner   string
	session string
	uid     types.UID
	// killed says the process is dead; lastRenewal is when the registry
	// saw its session renewed last.
	killed      bool
	lastRenewal time.Duration
	releasing   bool
	// exited says the live client is done (its request ended or is gone)
	// and has stopped renewing.
	exited bool
}

// createSession stores a session Lease and observes it at now.
func (r *registry) createSession(name, holder string, now time.Duration) {
	if r.sessions == nil {
		r.sessions = map[string]*simSession{}
	}
	r.uids++
	r.sessions[name] = &simSession{uid: fmt.Sprintf("lease-%d", r.uids), holder: holder, observedAt: now}
}

// sessionFacts are the controller's facts about every session.
func (r *registry) sessionFacts(now time.Duration) map[string]*fencing.Session {
	out := map[string]*fencing.Session{}
	for name, s := range r.sessions {
		out[name] = &fencing.Session{UID: s.uid, Holder: s.holder, Duration: sessionTTL, ObservedAt: r.wall(s.observedAt)}
		if r.sessionsNeverLapse {
			out[name].ObservedAt = r.wall(now)
		}
	}
	return out
}

// scheduleWaiters starts the round's session waiters when waiters are
// killed in this round.
func (w *world) scheduleWaiters() {
	if !w.fault[FaultKilledWaiter] {
		return
	}
	w.waiters = map[types.UID]*waiterProc{}
	onCounter, onEnd := w.reg.onCounter, w.reg.onEnd
	w.reg.onCounter = func(resource string, before, after *lockingv1alpha1.FenceCounterSpec, ended lockingv1alpha1.LockGrantPhase) {
		onCounter(resource, before, after, ended)
		h := after.Holder
		if h == nil || (before != nil && before.Holder != nil && before.Holder.UID == h.UID) {
			return
		}
		// Granted by this swap. A replica's grant was decided up to one
		// hop before it landed; the decision is what the session rule
		// judges.
		if p := w.waiters[types.UID(h.UID)]; p != nil && p.killed && w.s.now >= p.lastRenewal+sessionTTL+fencing.SessionMargin+w.replicaHop() {
			w.rep.DeadWaiterGranted++
			w.rep.violate("seed %d: %s granted at %s, its session lapsed at %s", w.seed, h.UID, w.s.now, p.lastRenewal+sessionTTL+fencing.SessionMargin)
		}
	}
	w.reg.onEnd = func(g *lockingv1alpha1.LockGrant) {
		onEnd(g)
		p := w.waiters[g.UID]
		if p == nil || p.killed || p.exited || readyReason(g) != lockingv1alpha1.LockGrantReasonSessionExpired {
			return
		}
		w.rep.LiveWaiterDropped++
		w.rep.violate("seed %d: %s of a live client ended %s at %s", w.seed, g.UID, lockingv1alpha1.LockGrantReasonSessionExpired, w.s.now)
	}
	for i := range 2 + w.rng.IntN(4) {
		w.s.after(w.between(time.Second, w.horizon/2), func() { w.startWaiter(i) })
	}
}

// startWaiter makes a client with a session and a request, renews the
// session every third of its TTL, and kills the client (70 %) at a random
// moment while it waits.
func (w *world) startWaiter(i int) {
	p := &waiterProc{w: w, owner: fmt.Sprintf("system:serviceaccount:billing:waiter-%d", i), session: fmt.Sprintf("lw-session-%d", i), lastRenewal: w.s.now}
	w.reg.createSession(p.session, p.owner, w.s.now)
	g := w.reg.create(p.owner, w.resource, int32(10+w.rng.IntN(21)), fmt.Sprintf("waiter-%d", i), w.s.now)
	g.Spec.Session = &lockingv1alpha1.SessionRef{Name: p.session, UID: w.reg.sessions[p.session].uid}
	w.reg.stampGrant(g)
	p.uid = g.UID
	w.waiters[g.UID] = p
	w.kick(w.resource)
	if w.chance(0.7) {
		w.s.after(w.between(100*time.Millisecond, 20*time.Second), func() {
			if g := w.reg.grants[p.uid]; g != nil && !g.Status.Phase.Final() && g.Status.Phase != lockingv1alpha1.PhaseHeld {
				p.killed = true
				w.rep.Faults[string(FaultKilledWaiter)]++
			}
		})
	}
	w.s.after(sessionTTL/3, p.tick)
}

// tick is one renewal of a live client's session; a live client whose
// request is Held releases it after a short while.
func (p *waiterProc) tick() {
	w := p.w
	if p.killed {
		return
	}
	w.s.after(w.netDelay(), func() {
		if p.killed {
			return
		}
		if s := w.reg.sessions[p.session]; s != nil {
			s.observedAt = w.s.now
			p.lastRenewal = w.s.now
		}
	})
	g := w.reg.grants[p.uid]
	if g == nil || g.Status.Phase.Final() {
		// Done: the process exits. A restore from an old snapshot may
		// bring its request back; nobody follows it any more.
		p.exited = true
		return
	}
	if g.Status.Phase == lockingv1alpha1.PhaseHeld && !p.releasing {
		p.releasing = true
		w.s.after(w.between(100*time.Millisecond, time.Second), func() {
			if err := w.reg.release(p.uid, p.owner, w.s.now); err == nil {
				w.kick(w.resource)
			}
		})
	}
	w.s.after(sessionTTL/3, p.tick)
}

// checkWaiters requires, at the end of the round, that every killed
// client's request ended within its session's lapse plus a reconcile.
func (w *world) checkWaiters() {
	const slack = 100 * time.Millisecond
	for uid, p := range w.waiters {
		if !p.killed {
			continue
		}
		bound := p.lastRenewal + sessionTTL + fencing.SessionMargin + slack + w.replicaLag()
		if bound > w.horizon {
			continue
		}
		ended, ok := w.h.endedAt[uid]
		if !ok && w.reg.grants[uid] == nil && w.restoredAt > 0 {
			// A restore from an older snapshot erased the request: it
			// can never be granted, so it holds nothing.
			w.rep.Faults["waiter-erased-by-restore"]++
			continue
		}
		if !ok || ended > bound {
			w.rep.DeadWaiterGranted++
			w.rep.violate("seed %d: the request %s of a client killed while waiting was still live at %s (ended %v, bound %s)", w.seed, uid, bound, ended, bound)
		}
	}
}

func readyReason(g *lockingv1alpha1.LockGrant) string {
	for _, c := range g.Status.Conditions {
		if c.Type == lockingv1alpha1.ConditionReady {
			return c.Reason
		}
	}
	return ""
}
