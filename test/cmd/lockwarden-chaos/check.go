package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// checkCommand re-checks a recorded history.
const checkCommand = "check"

// runCheck runs `lockwarden-chaos check --history FILE` and returns the
// exit code: 0 when the history passes.
func runCheck(args []string) int {
	fs := flag.NewFlagSet(checkCommand, flag.ContinueOnError)
	path := fs.String("history", "", "history.jsonl of a run (or a run directory, whose parts/ are merged).")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	paths := []string{*path}
	if st, err := os.Stat(*path); err == nil && st.IsDir() {
		var err error
		if paths, err = partFiles(*path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	history, err := readHistory(paths...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rep := Check(history)
	rep.Print(os.Stdout)
	if err := rep.WriteVisualizations(filepath.Dir(*path)); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if !rep.Passed() {
		return 1
	}
	return 0
}

// op is one operation of a worker: its invocation and, if it came, its
// completion.
type op struct {
	invoke Event
	done   *Event
}

// outcome is EventOK, EventFail or EventInfo; EventInfo also when no
// completion was recorded.
func (o *op) outcome() string {
	if o.done == nil {
		return EventInfo
	}
	return o.done.Kind
}

// grantInfo is what the history says about one LockGrant.
type grantInfo struct {
	name, uid, resource, owner string
	fence                      int64
	// phase and the times are the last seen.
	phase                                  string
	created, grantedAt, expiresAt, endedAt *time.Time
	// seenHeld and seenEnded are when the observer first saw the grant
	// Held and ended; zero if it never did.
	seenHeld, seenEnded time.Time
}

func (g *grantInfo) held() bool { return g.grantedAt != nil && g.fence > 0 }

func (g *grantInfo) ended() bool { return lockingv1alpha1.LockGrantPhase(g.phase).Final() }

// world is the history, indexed.
type world struct {
	events []Event
	ops    map[string]*op
	// opsOf lists each kind's operations in invocation order.
	opsOf  map[string][]*op
	grants map[string]*grantInfo
	// versions lists each guarded object's versions in the order the
	// observer saw them, each once (by resourceVersion).
	versions map[string][]Event
	final    map[string]Event
	gaps     []Event
	notes    map[string][]Event
	end      time.Time
}

func index(history []Event) *world {
	w := &world{
		events: history, ops: map[string]*op{}, opsOf: map[string][]*op{},
		grants: map[string]*grantInfo{}, versions: map[string][]Event{},
		final: map[string]Event{}, notes: map[string][]Event{},
	}
	seenRV := map[string]bool{}
	for _, e := range history {
		if e.Time.After(w.end) {
			w.end = e.Time
		}
		switch e.Kind {
		case EventInvoke:
			o := &op{invoke: e}
			w.ops[e.ID] = o
			w.opsOf[e.Op] = append(w.opsOf[e.Op], o)
			continue
		case EventOK, EventFail, EventInfo:
			if o := w.ops[e.ID]; o != nil && o.done == nil {
				o.done = &e
			}
			continue
		}
		switch e.Op {
		case NoteGrant, NoteFinalGrant:
			w.observeGrant(e)
		case NoteVersion:
			if !seenRV[e.Object+"/"+e.RV] {
				seenRV[e.Object+"/"+e.RV] = true
				w.versions[e.Object] = append(w.versions[e.Object], e)
			}
		case NoteFinalObject:
			w.final[e.Object] = e
		case NoteGap:
			w.gaps = append(w.gaps, e)
		default:
			w.notes[e.Op] = append(w.notes[e.Op], e)
		}
	}
	return w
}

func (w *world) observeGrant(e Event) {
	g := w.grants[e.Grant]
	if g == nil {
		g = &grantInfo{name: e.Grant, uid: e.UID, resource: e.Resource, owner: e.Owner, created: e.Created}
		w.grants[e.Grant] = g
	}
	g.phase = e.Phase
	if e.Fence > 0 {
		g.fence = e.Fence
	}
	g.grantedAt = firstNonNil(e.GrantedAt, g.grantedAt)
	g.expiresAt = firstNonNil(e.ExpiresAt, g.expiresAt)
	g.endedAt = firstNonNil(e.EndedAt, g.endedAt)
	if e.Op == NoteFinalGrant {
		return // not an observation in time
	}
	if e.Phase == "Held" && g.seenHeld.IsZero() {
		g.seenHeld = e.Time
	}
	if g.ended() && g.seenEnded.IsZero() {
		g.seenEnded = e.Time
	}
}

func firstNonNil(a, b *time.Time) *time.Time {
	if a != nil {
		return a
	}
	return b
}

// grantsOf returns the grants of resource that were ever Held, by
// grantedAt.
func (w *world) heldGrants(resource string) []*grantInfo {
	var gs []*grantInfo
	for _, g := range w.grants {
		if g.resource == resource && g.held() {
			gs = append(gs, g)
		}
	}
	slices.SortFunc(gs, func(a, b *grantInfo) int { return a.grantedAt.Compare(*b.grantedAt) })
	return gs
}

// resources returns every resource a grant or a version names, sorted.
func (w *world) resources() []string {
	set := map[string]bool{}
	for _, g := range w.grants {
		set[g.resource] = true
	}
	for _, vs := range w.versions {
		for _, v := range vs {
			set[v.Resource] = true
		}
	}
	return sortedKeys(set)
}

// firstOp returns the first operation of kind on grant, or nil.
func (w *world) firstOp(kind, grant string) *op {
	for _, o := range w.opsOf[kind] {
		if o.invoke.Grant == grant {
			return o
		}
	}
	return nil
}

// writeOf returns the write that produced version v, or nil.
func (w *world) writeOf(v Event) *op {
	o := w.ops[v.WriteID]
	if o == nil || o.invoke.Op != OpWrite {
		return nil
	}
	return o
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
