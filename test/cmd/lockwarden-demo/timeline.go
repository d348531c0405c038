package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// timeline collects what happened, from the workers' reports, the
// controller's status writes and the demo's own signals, and prints it in
// time order. Every clock involved is this machine's. It is safe for
// concurrent use.
type timeline struct {
	// start is time zero of the printed timeline.
	start   time.Time
	mu      sync.Mutex
	entries []entry
}

// entry is one line of the timeline.
type entry struct {
	at       time.Time
	actor    string // A, B, controller
	fence    int64  // 0: none
	action   string
	decision string
}

func (t *timeline) add(e entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entries = append(t.entries, e)
}

// addEvent records a worker's report.
func (t *timeline) addEvent(ev Event) {
	e := entry{at: ev.Time, actor: ev.Actor, fence: ev.Fence}
	switch ev.Event {
	case EventRequested:
		e.action = "request LockGrant " + ev.Detail
	case EventHeld:
		e.action = "sees its grant Held"
	case EventWriteAccepted:
		e.action, e.decision = "write ConfigMap ("+ev.Op+")", "ACCEPTED"
	case EventWriteRejected:
		e.action, e.decision = "write ConfigMap ("+ev.Op+")", "REJECTED "+ev.Detail
	case EventComputing:
		e.action = "computing (" + ev.Detail + " of work)"
	case EventReleased:
		e.action = "release LockGrant " + ev.Detail
	case EventFailed:
		e.action, e.decision = "gives up", "ERROR "+ev.Detail
	default:
		e.action = ev.Event + " " + ev.Detail
	}
	t.add(e)
}

// addGrant records a phase the controller gave a grant, at the time the
// controller wrote in its status.
func (t *timeline) addGrant(g *lockingv1alpha1.LockGrant) {
	actor := actorOf(g.Spec.Owner)
	st := g.Status
	e := entry{at: time.Now(), actor: "controller", fence: st.FenceToken}
	if st.EndedAt != nil {
		e.at = st.EndedAt.Time
	}
	switch st.Phase {
	case lockingv1alpha1.PhasePending:
		e.action, e.decision = "queue "+actor+"'s request", "PENDING"
	case lockingv1alpha1.PhaseHeld:
		if st.GrantedAt != nil {
			e.at = st.GrantedAt.Time
		}
		e.action, e.decision = "grant the resource to "+actor, "HELD until "+t.clock(st.ExpiresAt.Time)
	case lockingv1alpha1.PhaseExpired:
		e.action = "expire " + actor + "'s grant"
		if st.ExpiresAt != nil {
			e.action += " (lease ended " + t.clock(st.ExpiresAt.Time) + ")"
		}
		e.decision = "EXPIRED"
	default:
		e.action, e.decision = "end "+actor+"'s grant", strings.ToUpper(string(st.Phase))
	}
	t.add(e)
}

// print writes the timeline in time order.
func (t *timeline) print(w io.Writer) {
	t.mu.Lock()
	entries := slices.Clone(t.entries)
	t.mu.Unlock()
	slices.SortStableFunc(entries, func(a, b entry) int { return a.at.Compare(b.at) })

	fmt.Fprintln(w, "\nTimeline (seconds since worker A started):")
	for _, e := range entries {
		fence := ""
		if e.fence > 0 {
			fence = fmt.Sprintf("fence %d", e.fence)
		}
		line := fmt.Sprintf("%8s  %-10s  %-7s  %-44s  %s", t.clock(e.at), e.actor, fence, e.action, e.decision)
		fmt.Fprintln(w, trimRight(line))
	}
}

// clock formats at as seconds since the start.
func (t *timeline) clock(at time.Time) string {
	return fmt.Sprintf("%.1fs", at.Sub(t.start).Seconds())
}

// actorOf names the worker an identity belongs to.
func actorOf(user string) string {
	for actor, sa := range workers {
		if serviceAccountUser(sa) == user {
			return actor
		}
	}
	return user
}

func trimRight(s string) string { return strings.TrimRight(s, " ") }
