package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Event is one line of the history. Operations are recorded Jepsen-style: an
// EventInvoke line before the request is sent and, with the same ID, one
// completion line (EventOK, EventFail or EventInfo) after it; an invocation
// without a completion has an unknown outcome. Facts (what the observer saw,
// what the chaos driver did, holder state changes) are EventNote lines.
// Times are wall-clock instants of the one host every process runs on, so
// they compare with the controller's grantedAt, expiresAt and endedAt.
type Event struct {
	// Time is when the event happened.
	Time time.Time `json:"time"`
	// Proc is who recorded it: worker-N, observer or chaos.
	Proc string `json:"proc"`
	// Kind is one of the Event... kinds.
	Kind string `json:"kind"`
	// Op names the operation (Op... constants) or the fact (Note...).
	Op string `json:"op"`
	// ID pairs an invocation with its completion; unique in the run.
	ID string `json:"id,omitempty"`

	// Resource is the resource ID of a grant or a guarded object.
	Resource string `json:"resource,omitempty"`
	// Grant is a LockGrant name; UID its UID.
	Grant string `json:"grant,omitempty"`
	UID   string `json:"uid,omitempty"`
	// Fence is a grant's fencing token, or the fence a write carries or an
	// object version records.
	Fence int64 `json:"fence,omitempty"`
	// Object is the name of a guarded ConfigMap.
	Object string `json:"object,omitempty"`
	// Count is the counter value read or written; for a renew, the
	// spec.renewals value sent.
	Count int64 `json:"count,omitempty"`
	// RV is an object's resourceVersion (opaque; only compared for
	// equality); ExpectRV is the precondition of a write ("" for a create).
	RV       string `json:"rv,omitempty"`
	ExpectRV string `json:"expectRV,omitempty"`
	// Unconditional marks an update sent without a precondition.
	Unconditional bool `json:"unconditional,omitempty"`
	// WriteID is the ID of the write that produced an object version.
	WriteID string `json:"writeID,omitempty"`
	// Reason is the reason code of a refusal, CONFLICT, or a holder state.
	Reason string `json:"reason,omitempty"`
	// Detail is free text: an error, a fault's parameters.
	Detail string `json:"detail,omitempty"`

	// Phase and the times below describe a LockGrant as the observer saw it.
	Phase     string     `json:"phase,omitempty"`
	Owner     string     `json:"owner,omitempty"`
	Created   *time.Time `json:"created,omitempty"`
	GrantedAt *time.Time `json:"grantedAt,omitempty"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	EndedAt   *time.Time `json:"endedAt,omitempty"`
	// Deadline is a worker's local deadline, as a wall-clock estimate.
	Deadline *time.Time `json:"deadline,omitempty"`
}

// Kinds of events.
const (
	EventInvoke = "invoke"
	EventOK     = "ok"
	EventFail   = "fail"
	EventInfo   = "info"
	EventNote   = "note"
)

// Operations of workers.
const (
	// OpAcquire: create a LockGrant and wait until it is Held. ok carries
	// the grant, UID and fence; fail means it ended or was withdrawn first.
	OpAcquire = "acquire"
	// OpRenew: raise spec.renewals to Count.
	OpRenew = "renew"
	// OpRelease: set spec.release.
	OpRelease = "release"
	// OpRead: get the guarded object of a resource: Count and RV (RV ""
	// when it does not exist).
	OpRead = "read"
	// OpWrite: create (ExpectRV "") or update (precondition ExpectRV, or
	// none if Unconditional) the guarded object with Count under Grant and
	// Fence. ok carries the new RV; fail Reason is the admission refusal or
	// CONFLICT.
	OpWrite = "write"
	// OpStray: a request to the guarded object of a resource that asserts
	// no claim of its own, sent by a worker whose grant (Grant, Fence) has
	// ended, as a replica that lost its lease still sends it: a merge patch
	// of data only (Detail "merge-patch") or a delete without a
	// precondition (Detail "delete"). Admission must refuse every one.
	OpStray = "stray"
)

// Facts.
const (
	// NoteGrant (observer): a LockGrant as seen by a watch event.
	NoteGrant = "grant"
	// NoteVersion (observer): a version of a guarded object.
	NoteVersion = "version"
	// NoteLeader (observer): the leader Lease names a new holder (Detail).
	NoteLeader = "leader"
	// NoteGap (observer): a watch could not resume where it stopped; some
	// versions may be missing and the checks of the objects are void.
	NoteGap = "observer-gap"
	// NoteFinalGrant, NoteFinalObject (driver): the state after the run.
	NoteFinalGrant  = "final-grant"
	NoteFinalObject = "final-object"
	// NoteUnknownBegin (worker): the holder machine went OWNERSHIP_UNKNOWN;
	// Deadline is the local deadline that passed.
	NoteUnknownBegin = "unknown-begin"
	// NoteUnknownEnd (worker): a read or the registry's answer settled it;
	// Reason is the new state.
	NoteUnknownEnd = "unknown-end"
	// NoteDone (worker): the handle's Done closed, the worker may start no
	// new effect under Grant; Reason says why (OWNERSHIP_UNKNOWN, RELEASED,
	// or the registry's reason), Detail is the handle's error.
	NoteDone = "handle-done"
	// NoteFault (chaos): a fault began; NoteHeal: it ended. Detail says which.
	NoteFault = "fault"
	NoteHeal  = "heal"
	// NotePaused (worker): the worker stops itself, armed by the driver,
	// with write ID prepared and not sent.
	NotePaused = "paused-before-write"
	// NoteWorkerExit (driver): a worker process exited; Detail is how.
	NoteWorkerExit = "worker-exit"
)

// recorder appends events to a history file, one JSON line per event and
// one write per line, so a process frozen or killed between two events
// leaves every earlier line whole.
type recorder struct {
	proc string
	mu   sync.Mutex
	f    *os.File
}

// newRecorder opens (appending) the history file of proc.
func newRecorder(path, proc string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{proc: proc, f: f}, nil
}

// emit records e, stamped with the recorder's process and, unless set, now.
func (r *recorder) emit(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Proc = r.proc
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("encoding a history event: %v", err))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(append(b, '\n'))
}

func (r *recorder) close() error { return r.f.Close() }

// readHistory reads every *.jsonl file of dir except merged, or one file,
// and returns the events in time order (stable for equal times).
func readHistory(paths ...string) ([]Event, error) {
	var all []Event
	for _, p := range paths {
		evs, err := readEvents(p)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	slices.SortStableFunc(all, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return all, nil
}

func readEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []Event
	var torn error
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for line := 1; sc.Scan(); line++ {
		if torn != nil {
			return nil, torn
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// A process killed mid-write leaves at most a torn last
			// line, which is skipped; anywhere else it is an error.
			torn = fmt.Errorf("%s:%d: %w", path, line, err)
			continue
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}

// writeHistory writes events as JSON lines to path.
func writeHistory(path string, evs []Event) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	if err := encodeEvents(w, evs); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func encodeEvents(w io.Writer, evs []Event) error {
	enc := json.NewEncoder(w)
	for _, e := range evs {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}

// partFiles lists the per-process history files of a run directory.
func partFiles(dir string) ([]string, error) {
	return filepath.Glob(filepath.Join(dir, "parts", "*.jsonl"))
}

func timePtr(t time.Time) *time.Time { return &t }
