package main

import (
	"regexp"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
)

// denialRE finds the reason code at the start of an admission webhook's
// denial, after the API server's prefix and, for a Forbidden error built by
// the webhook, the "<resource> \"name\" is forbidden: " part.
var denialRE = regexp.MustCompile(`denied the request: (?:.*? is forbidden: )?([A-Z][A-Z_]*[A-Z]): `)

// admissionDenial returns the reason code and the message, from the code
// on, of a write refused by a lockwarden admission webhook; ok is false for
// any other error.
func admissionDenial(err error) (reason, message string, ok bool) {
	if !apierrors.IsForbidden(err) {
		return "", "", false
	}
	msg := err.Error()
	m := denialRE.FindStringSubmatchIndex(msg)
	if m == nil {
		return "", "", false
	}
	return msg[m[2]:m[3]], msg[m[2]:], true
}
