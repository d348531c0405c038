package main

import (
	"fmt"
	"time"
)

// Names of the checks, as the report prints them.
const (
	checkFences    = "accepted fences never decrease per object"
	checkNoLoss    = "no acknowledged write lost"
	checkNoStale   = "no write of an expired or superseded grant accepted"
	checkNoStray   = "no request asserting nothing accepted (patch, delete)"
	checkOneHeld   = "at most one Held grant per resource at any controller time"
	checkLockModel = "linearizable: fenced lock per resource (porcupine)"
	checkRegister  = "linearizable: CAS register per object (porcupine)"
	checkRun       = "the run itself (observer, failover, quiescence)"
)

// Violation is one broken rule, with its evidence.
type Violation struct {
	Check  string
	Detail string
}

func violation(check, format string, args ...any) Violation {
	return Violation{Check: check, Detail: fmt.Sprintf(format, args...)}
}

// checkFenceOrder: along each object's versions, the fence recorded never
// decreases.
func (w *world) checkFenceOrder() []Violation {
	var vs []Violation
	for _, obj := range sortedKeys(w.versions) {
		var prev Event
		for i, v := range w.versions[obj] {
			if i > 0 && v.Fence < prev.Fence {
				vs = append(vs, violation(checkFences, "%s: version %s (write %s) has fence %d after version %s (write %s) with fence %d",
					obj, v.RV, v.WriteID, v.Fence, prev.RV, prev.WriteID, prev.Fence))
			}
			prev = v
		}
	}
	return vs
}

// checkLostWrites: every version is one increment of the one before, made
// by a write a worker invoked and did not see refused; every acknowledged
// write is a version; the object after the run is the last version seen.
func (w *world) checkLostWrites() []Violation {
	var vs []Violation
	applied := map[string]Event{}
	for _, obj := range sortedKeys(w.versions) {
		versions := w.versions[obj]
		var prev int64
		for _, v := range versions {
			applied[v.WriteID] = v
			if v.Count != prev+1 {
				vs = append(vs, violation(checkNoLoss, "%s: version %s (write %s) has count %d after count %d: an increment was lost or doubled",
					obj, v.RV, v.WriteID, v.Count, prev))
			}
			prev = v.Count
			o := w.writeOf(v)
			switch {
			case o == nil:
				vs = append(vs, violation(checkNoLoss, "%s: version %s names write %q, which no worker invoked", obj, v.RV, v.WriteID))
			case o.outcome() == EventFail:
				vs = append(vs, violation(checkNoLoss, "%s: write %s was refused (%s) but is version %s", obj, v.WriteID, o.done.Reason, v.RV))
			case o.outcome() == EventOK && o.done.RV != v.RV:
				vs = append(vs, violation(checkNoLoss, "%s: write %s was acknowledged as version %s but shows as version %s", obj, v.WriteID, o.done.RV, v.RV))
			case o.invoke.Count != v.Count || o.invoke.Fence != v.Fence || o.invoke.Grant != v.Grant:
				vs = append(vs, violation(checkNoLoss, "%s: version %s differs from its write %s", obj, v.RV, v.WriteID))
			}
		}
		final, ok := w.final[obj]
		switch {
		case !ok:
			vs = append(vs, violation(checkNoLoss, "%s: the object is missing after the run", obj))
		case len(versions) == 0 || final.RV != versions[len(versions)-1].RV:
			vs = append(vs, violation(checkNoLoss, "%s: the object after the run (version %s, count %d) is not the last version the observer saw",
				obj, final.RV, final.Count))
		case final.Count != int64(len(versions)):
			vs = append(vs, violation(checkNoLoss, "%s: count %d after the run, but %d accepted writes", obj, final.Count, len(versions)))
		}
	}
	for obj := range w.final {
		if _, ok := w.versions[obj]; !ok {
			vs = append(vs, violation(checkNoLoss, "%s: exists after the run but the observer saw no version of it", obj))
		}
	}
	for _, o := range w.opsOf[OpWrite] {
		if o.outcome() != EventOK {
			continue
		}
		if _, ok := applied[o.invoke.ID]; !ok {
			vs = append(vs, violation(checkNoLoss, "%s: write %s (count %d, fence %d) was acknowledged as version %s and is lost",
				o.invoke.Object, o.invoke.ID, o.invoke.Count, o.invoke.Fence, o.done.RV))
		}
	}
	return vs
}

// late says why write o could not be current when it was invoked, or "":
// it was invoked at or after its grant's last expiresAt (renewals only move
// it later, and admission compares it with its own clock), after the
// observer saw the grant end, or after the observer saw a later grant of
// the resource Held (its fence was issued before its status was written).
// Every process runs on one host, so the times compare; such a write
// reached admission later still, and admission must refuse it.
func (w *world) late(o *op) string {
	g := w.grants[o.invoke.Grant]
	if g == nil {
		return ""
	}
	t := o.invoke.Time
	if g.expiresAt != nil && !t.Before(*g.expiresAt) {
		return fmt.Sprintf("invoked at %s, %s after grant %s expired at %s",
			stamp3(t), t.Sub(*g.expiresAt).Round(time.Millisecond), g.name, stamp3(*g.expiresAt))
	}
	if !g.seenEnded.IsZero() && !t.Before(g.seenEnded) {
		return fmt.Sprintf("invoked at %s, after grant %s was seen %s at %s", stamp3(t), g.name, g.phase, stamp3(g.seenEnded))
	}
	for _, s := range w.heldGrants(g.resource) {
		if s.fence > g.fence && !s.seenHeld.IsZero() && !t.Before(s.seenHeld) {
			return fmt.Sprintf("invoked at %s, after grant %s (fence %d) was seen Held at %s", stamp3(t), s.name, s.fence, stamp3(s.seenHeld))
		}
	}
	return ""
}

// checkStaleWrites: each accepted write carries its grant's fence, and
// none was late (see late).
func (w *world) checkStaleWrites() []Violation {
	var vs []Violation
	for _, obj := range sortedKeys(w.versions) {
		for _, v := range w.versions[obj] {
			g := w.grants[v.Grant]
			if g == nil {
				vs = append(vs, violation(checkNoStale, "%s: version %s carries grant %q, which the registry never had", obj, v.RV, v.Grant))
				continue
			}
			if g.resource != v.Resource || g.fence != v.Fence {
				vs = append(vs, violation(checkNoStale, "%s: version %s carries fence %d of grant %s (resource %s, fence %d)",
					obj, v.RV, v.Fence, g.name, g.resource, g.fence))
			}
			if o := w.writeOf(v); o != nil {
				if why := w.late(o); why != "" {
					vs = append(vs, violation(checkNoStale, "%s: write %s (fence %d) was %s, and accepted as version %s", obj, o.invoke.ID, v.Fence, why, v.RV))
				}
			}
		}
	}
	return vs
}

// checkStrays: no stray request (a merge patch of data only or a delete
// without a precondition, from a worker whose grant had ended) was
// acknowledged or shows as a version.
func (w *world) checkStrays() []Violation {
	var vs []Violation
	for _, o := range w.opsOf[OpStray] {
		if o.outcome() == EventOK {
			vs = append(vs, violation(checkNoStray, "%s: %s %s by %s (grant %s, fence %d, ended) was accepted",
				o.invoke.Object, o.invoke.Detail, o.invoke.ID, o.invoke.Proc, o.invoke.Grant, o.invoke.Fence))
		}
	}
	for _, obj := range sortedKeys(w.versions) {
		for _, v := range w.versions[obj] {
			if o := w.ops[v.WriteID]; o != nil && o.invoke.Op == OpStray {
				vs = append(vs, violation(checkNoStray, "%s: version %s is the %s %s by %s (grant %s ended)",
					obj, v.RV, o.invoke.Detail, o.invoke.ID, o.invoke.Proc, o.invoke.Grant))
			}
		}
	}
	return vs
}

// checkOneHeld: by the controller's own times, a resource's grants are Held
// one after the other (each granted no earlier than the previous one
// ended), their fences increase in that order, and no grant is expired
// before its expiresAt.
func (w *world) checkOneHeld() []Violation {
	var vs []Violation
	for _, res := range w.resources() {
		gs := w.heldGrants(res)
		for i, g := range gs {
			if g.phase == "Expired" && g.endedAt != nil && g.expiresAt != nil && g.endedAt.Before(*g.expiresAt) {
				vs = append(vs, violation(checkOneHeld, "%s: grant %s was expired at %s, before its expiresAt %s",
					res, g.name, stamp3(*g.endedAt), stamp3(*g.expiresAt)))
			}
			if i == 0 {
				continue
			}
			p := gs[i-1]
			if g.fence <= p.fence {
				vs = append(vs, violation(checkOneHeld, "%s: grant %s (fence %d) was granted after grant %s (fence %d)", res, g.name, g.fence, p.name, p.fence))
			}
			switch {
			case p.endedAt == nil:
				vs = append(vs, violation(checkOneHeld, "%s: grant %s was granted at %s while grant %s (granted %s) never ended",
					res, g.name, stamp3(*g.grantedAt), p.name, stamp3(*p.grantedAt)))
			case g.grantedAt.Before(*p.endedAt):
				vs = append(vs, violation(checkOneHeld, "%s: grant %s was granted at %s, %s before grant %s ended at %s",
					res, g.name, stamp3(*g.grantedAt), p.endedAt.Sub(*g.grantedAt), p.name, stamp3(*p.endedAt)))
			}
		}
	}
	return vs
}

// checkRunSound: the run produced a complete history and the manager
// behaved as a highly available controller should: the observer never lost
// track, a killed leader was replaced, every replica came back, and every
// grant ended after the run.
func (w *world) checkRunSound() []Violation {
	var vs []Violation
	for _, g := range w.gaps {
		vs = append(vs, violation(checkRun, "the observer lost track of a watch (%s): the object checks are incomplete", g.Detail))
	}
	for _, kind := range []string{NoteFailoverTimeout, NoteManagerNotReady, NoteNotQuiesced} {
		for _, n := range w.notes[kind] {
			vs = append(vs, violation(checkRun, "%s at %s: %s", kind, stamp3(n.Time), n.Detail))
		}
	}
	return vs
}

// stamp3 formats t as a clock time with milliseconds.
func stamp3(t time.Time) string { return t.Format("15:04:05.000") }
