package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// t0 is the start of every synthetic history.
var t0 = time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func atp(ms int) *time.Time { return timePtr(at(ms)) }

// history builds a synthetic history.
type history []Event

func (h *history) add(ms int, proc, kind, op string, e Event) {
	e.Time, e.Proc, e.Kind, e.Op = at(ms), proc, kind, op
	*h = append(*h, e)
}

// grant records an observer note of a grant.
func (h *history) grant(ms int, name, phase string, fence int64, granted, expires, ended int) {
	e := Event{Resource: "chaos/r", Grant: name, Phase: phase, Fence: fence, Created: atp(0), Owner: "w"}
	if granted >= 0 {
		e.GrantedAt = atp(granted)
	}
	if expires >= 0 {
		e.ExpiresAt = atp(expires)
	}
	if ended >= 0 {
		e.EndedAt = atp(ended)
	}
	h.add(ms, "observer", EventNote, NoteGrant, e)
}

// version records an observer note of an object version.
func (h *history) version(ms int, rv string, count, fence int64, grant, writeID string) {
	h.add(ms, "observer", EventNote, NoteVersion, Event{
		Object: "counter-r", Resource: "chaos/r", RV: rv, Count: count, Fence: fence, Grant: grant, WriteID: writeID,
	})
}

// write records a write's invocation and completion (kind "" for none).
func (h *history) write(proc, id string, inv, done int, kind string, e Event) {
	e.ID, e.Object, e.Resource = id, "counter-r", "chaos/r"
	h.add(inv, proc, EventInvoke, OpWrite, e)
	if kind != "" {
		h.add(done, proc, kind, OpWrite, e)
	}
}

func (h *history) op(proc, op, id string, inv, done int, kind string, e Event) {
	e.ID, e.Resource = id, "chaos/r"
	h.add(inv, proc, EventInvoke, op, e)
	if kind != "" {
		h.add(done, proc, kind, op, e)
	}
}

// cleanHistory: worker a takes g1 (fence 1), creates the counter, and
// releases; worker b, waiting, takes g2 (fence 2), increments, and
// releases. Both leases are 4 s.
func cleanHistory() history {
	var h history
	h.op("a", OpAcquire, "a1", 0, 20, EventOK, Event{Grant: "g1", Fence: 1})
	h.op("b", OpAcquire, "b1", 1, 90, EventOK, Event{Grant: "g2", Fence: 2})
	h.grant(10, "g1", "Held", 1, 5, 4005, -1)
	h.op("a", OpRead, "a2", 30, 35, EventOK, Event{Object: "counter-r"})
	h.write("a", "a3", 40, 50, EventOK, Event{Grant: "g1", Fence: 1, Count: 1, RV: "100"})
	h.version(55, "100", 1, 1, "g1", "a3")
	h.op("a", OpRelease, "a4", 60, 70, EventOK, Event{Grant: "g1"})
	h.grant(80, "g1", "Released", 1, 5, 4005, 75)
	h.grant(85, "g2", "Held", 2, 76, 4076, -1)
	h.op("b", OpRead, "b2", 100, 105, EventOK, Event{Object: "counter-r", Count: 1, RV: "100"})
	h.write("b", "b3", 110, 120, EventOK, Event{Grant: "g2", Fence: 2, Count: 2, ExpectRV: "100", RV: "200"})
	h.version(125, "200", 2, 2, "g2", "b3")
	h.op("b", OpRelease, "b4", 130, 135, EventOK, Event{Grant: "g2"})
	h.grant(140, "g2", "Released", 2, 76, 4076, 138)
	h.add(9000, "driver", EventNote, NoteFinalObject, Event{Object: "counter-r", Resource: "chaos/r", RV: "200", Count: 2, Fence: 2, Grant: "g2", WriteID: "b3"})
	return h
}

func (h history) sorted() []Event {
	evs := slices.Clone([]Event(h))
	slices.SortStableFunc(evs, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return evs
}

func TestCheckCleanHistoryPasses(t *testing.T) {
	rep := Check(cleanHistory().sorted())
	if !rep.Passed() {
		t.Fatalf("violations in a clean history: %+v", rep.Violations)
	}
	if got := rep.HandoffRelease; len(got) != 1 || got[0] != 16*time.Millisecond {
		t.Errorf("release handoff = %v, want [16ms] (release at +60ms, successor granted at +76ms)", got)
	}
}

// TestCheckFindsViolations: each broken rule is reported by the check that
// owns it.
func TestCheckFindsViolations(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(h history) history
		want   []string
	}{{
		name: "a write invoked after its grant expired is accepted",
		mutate: func(h history) history {
			// a, paused, writes with g1 at +5 s, after g1 expired
			// (+4.005 s) and g2 was granted; admission lets it through.
			h.write("a", "a9", 5000, 5010, EventOK, Event{Grant: "g1", Fence: 1, Count: 3, Unconditional: true, RV: "300"})
			h.version(5015, "300", 3, 1, "g1", "a9")
			return retarget(h, "300", 3, 1, "g1", "a9")
		},
		want: []string{checkFences, checkNoStale, checkLockModel},
	}, {
		name: "an acknowledged write is lost",
		mutate: func(h history) history {
			h.write("b", "b9", 131, 133, EventOK, Event{Grant: "g2", Fence: 2, Count: 3, ExpectRV: "200", RV: "250"})
			return h
		},
		want: []string{checkNoLoss, checkRegister},
	}, {
		name: "a version skips a count",
		mutate: func(h history) history {
			for i := range h {
				if h[i].Op == NoteVersion && h[i].RV == "200" || h[i].Op == NoteFinalObject || h[i].ID == "b3" {
					h[i].Count = 3
				}
			}
			return h
		},
		want: []string{checkNoLoss},
	}, {
		name: "two grants are Held at once",
		mutate: func(h history) history {
			for i := range h {
				if h[i].Grant == "g2" && h[i].GrantedAt != nil {
					h[i].GrantedAt = atp(70) // before g1 ended at +75 ms
				}
			}
			return h
		},
		want: []string{checkOneHeld},
	}, {
		name: "a grant is expired before its expiresAt",
		mutate: func(h history) history {
			h.grant(90, "g1", "Expired", 1, 5, 4005, 75)
			return h
		},
		want: []string{checkOneHeld},
	}, {
		name: "a read returns a value overwritten before it was invoked",
		mutate: func(h history) history {
			h.op("a", OpRead, "a8", 150, 160, EventOK, Event{Object: "counter-r", Count: 1, RV: "100"})
			return h
		},
		want: []string{checkRegister},
	}, {
		name: "a refused write shows up in the object",
		mutate: func(h history) history {
			for i := range h {
				if h[i].ID == "b3" && h[i].Kind == EventOK {
					h[i].Kind, h[i].Reason = EventFail, "STALE_OWNER"
				}
			}
			return h
		},
		want: []string{checkNoLoss, checkRegister},
	}, {
		name: "a stale replica's merge patch of data only is accepted",
		mutate: func(h history) history {
			// a, whose g1 ended, patches the data without a claim while g2
			// holds; admission lets it through on g2's inherited claim.
			h.op("a", OpStray, "a6", 126, 128, EventOK, Event{Object: "counter-r", Grant: "g1", Fence: 1, Detail: "merge-patch"})
			h.version(129, "210", -1, 2, "g2", "a6")
			return retarget(h, "210", -1, 2, "g2", "a6")
		},
		want: []string{checkNoStray, checkNoLoss, checkRegister},
	}, {
		name: "a stale replica's delete without a precondition is accepted",
		mutate: func(h history) history {
			h.op("a", OpStray, "a6", 126, 128, EventOK, Event{Object: "counter-r", Grant: "g1", Fence: 1, Detail: "delete"})
			return h
		},
		want: []string{checkNoStray},
	}, {
		name: "the observer lost track",
		mutate: func(h history) history {
			h.add(50, "observer", EventNote, NoteGap, Event{Detail: "410 Gone"})
			return h
		},
		want: []string{checkRun},
	}, {
		name: "the manager does not fail over",
		mutate: func(h history) history {
			h.add(150, "chaos", EventNote, NoteFailoverTimeout, Event{Detail: "no new leader"})
			return h
		},
		want: []string{checkRun},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := Check(tc.mutate(cleanHistory()).sorted())
			got := map[string]bool{}
			for _, v := range rep.Violations {
				got[v.Check] = true
			}
			for _, w := range tc.want {
				if !got[w] {
					t.Errorf("no violation of %q; got %+v", w, rep.Violations)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("violations of %d checks, want %d: %+v", len(got), len(tc.want), rep.Violations)
			}
		})
	}
}

// retarget makes the object after the run the given version.
func retarget(h history, rv string, count, fence int64, grant, writeID string) history {
	for i := range h {
		if h[i].Op == NoteFinalObject {
			h[i].RV, h[i].Count, h[i].Fence, h[i].Grant, h[i].WriteID = rv, count, fence, grant, writeID
		}
	}
	return h
}

// TestCheckUnknownOutcomes: a write whose outcome the worker never learnt
// counts when the object shows it and is left out when it does not.
func TestCheckUnknownOutcomes(t *testing.T) {
	h := cleanHistory()
	for i := range h {
		if h[i].ID == "b3" && h[i].Kind == EventOK {
			h[i].Kind, h[i].Detail = EventInfo, "context deadline exceeded"
		}
	}
	h.write("b", "b7", 126, 0, "", Event{Grant: "g2", Fence: 2, Count: 3, ExpectRV: "100"})
	// Stray requests refused, or of unknown outcome and without effect,
	// break nothing.
	h.op("a", OpStray, "a6", 90, 95, EventFail, Event{Object: "counter-r", Grant: "g1", Fence: 1, Detail: "merge-patch", Reason: "NO_FENCE"})
	h.op("a", OpStray, "a7", 96, 0, "", Event{Object: "counter-r", Grant: "g1", Fence: 1, Detail: "delete"})
	rep := Check(h.sorted())
	if !rep.Passed() {
		t.Fatalf("violations: %+v", rep.Violations)
	}
	if rep.Ambiguous != 2 || rep.AmbApplied != 1 {
		t.Errorf("ambiguous writes %d (applied %d), want 2 (applied 1)", rep.Ambiguous, rep.AmbApplied)
	}
}

func TestReportPrints(t *testing.T) {
	var b strings.Builder
	Check(cleanHistory().sorted()).Print(&b)
	for _, want := range []string{"Handoff latency, release -> successor Held: n=1 p50=16ms", checkLockModel, "Final counters: counter-r=2"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
