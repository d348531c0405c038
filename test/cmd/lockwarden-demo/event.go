package main

import (
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// Event is one line a worker prints on its stdout, as a JSON object: the
// workers' only channel to the demo.
type Event struct {
	// Time is when it happened, by the worker's clock.
	Time time.Time `json:"time"`
	// Actor is the worker's name in the story: "A" or "B".
	Actor string `json:"actor"`
	// Event is one of the Event... constants.
	Event string `json:"event"`
	// Fence is the fencing token the worker holds; 0 before it holds one.
	Fence int64 `json:"fence,omitempty"`
	// Op is "create" or "update" for a write.
	Op string `json:"op,omitempty"`
	// Reason is the reason code of a refused write, e.g. STALE_OWNER.
	Reason string `json:"reason,omitempty"`
	// Detail is a grant name, a duration, a denial message or an error.
	Detail string `json:"detail,omitempty"`
}

// Values of Event.Event.
const (
	// EventRequested: the worker created its LockGrant; Time is when it
	// sent the create, Detail the name the API server gave the grant.
	EventRequested = "requested"
	// EventHeld: the grant is Held; Fence is its token, Detail its name.
	EventHeld = "held"
	// EventWriteAccepted: a write of the guarded ConfigMap was accepted.
	EventWriteAccepted = "write-accepted"
	// EventWriteRejected: admission refused a write; Reason is its code and
	// Detail the denial ("STALE_OWNER: fence 1 is older than ...").
	EventWriteRejected = "write-rejected"
	// EventComputing: the worker starts its work; Detail is how long.
	EventComputing = "computing"
	// EventReleased: the worker released its grant.
	EventReleased = "released"
	// EventFailed: the worker gave up; Detail is the error.
	EventFailed = "failed"
	// EventTerminating: the worker (with --finish-on-term) got SIGTERM
	// and finishes its writes.
	EventTerminating = "terminating"
)

// admissionDenial returns the reason code and the message, from the code
// on, of a request refused by a lockwarden admission webhook, as the public
// decoder (pkg/fencing/denial) reads it; ok is false for any other error.
func admissionDenial(err error) (reason, message string, ok bool) {
	r := denial.Refusal(err)
	if r == nil {
		return "", "", false
	}
	return string(r.Reason), r.Error(), true
}
