package main

import (
	"strings"
	"time"
)

// checkWebhook: while a manager replica is healthy, no guarded write is
// refused because admission could not be reached.
const checkWebhook = "no guarded write refused while a replica is healthy"

// webhookGrace is how long after a fault begins on a replica a request may
// still be refused for webhook unavailability although the other replica
// is healthy: the time for the balancer's readiness probe to notice the
// fault, plus the webhook's one-second timeout for a request already sent
// to the faulty replica. A frozen or killed replica fails its probe within
// half a second; a cut-off one only once its Lease is 2 s without renewal.
var webhookGrace = map[string]time.Duration{
	"kill":      1500 * time.Millisecond,
	"freeze":    2 * time.Second,
	"partition": 4 * time.Second,
}

// unavailable reports whether a request failed because the API server
// could not get an answer from the admission webhook (refused fail-closed:
// the write had no effect).
func unavailable(o *op) bool {
	if o.done == nil || o.done.Kind != EventInfo {
		return false
	}
	d := o.done.Detail
	return strings.Contains(d, "failed calling webhook") || strings.Contains(d, "failed to call webhook")
}

// downSpan is a replica's time from the start of a fault until it was
// ready again (end zero: never, in this history).
type downSpan struct {
	replica, kind string
	from, to      time.Time
}

// replicaDowntime reads the driver's replica-down and replica-up notes.
func (w *world) replicaDowntime() (spans []downSpan, replicas map[string]bool) {
	replicas = map[string]bool{}
	open := map[string]int{}
	for _, e := range w.events {
		switch e.Op {
		case NoteReplicaDown:
			name, kind, _ := strings.Cut(e.Detail, " ")
			replicas[name] = true
			if _, ok := open[name]; ok {
				continue // still down from an earlier fault
			}
			open[name] = len(spans)
			spans = append(spans, downSpan{replica: name, kind: kind, from: e.Time})
		case NoteReplicaUp:
			replicas[e.Detail] = true
			if i, ok := open[e.Detail]; ok {
				spans[i].to = e.Time
				delete(open, e.Detail)
			}
		}
	}
	return spans, replicas
}

// checkWebhookAvailable fails a refusal for webhook unavailability unless,
// over the request's span extended back by the grace of a fault, either no
// replica stayed healthy, or a fault began on some replica (the request
// may have been on its way to it).
func (w *world) checkWebhookAvailable() (vs []Violation, refused map[string]int, excused int) {
	spans, replicas := w.replicaDowntime()
	refused = map[string]int{}
	for _, kind := range []string{OpWrite, OpStray, OpAcquire, OpRenew, OpRelease} {
		for _, o := range w.opsOf[kind] {
			if !unavailable(o) {
				continue
			}
			refused[kind]++
			if kind != OpWrite && kind != OpStray {
				continue // the target is about guarded writes
			}
			from, to := o.invoke.Time, o.done.Time
			faultNear, healthy := false, map[string]bool{}
			for name := range replicas {
				healthy[name] = true
			}
			for _, s := range spans {
				grace := webhookGrace[s.kind]
				if !s.from.Before(from.Add(-grace)) && !s.from.After(to) {
					faultNear = true
				}
				if s.from.Before(to) && (s.to.IsZero() || s.to.After(from)) {
					healthy[s.replica] = false
				}
			}
			anyHealthy := false
			for _, h := range healthy {
				anyHealthy = anyHealthy || h
			}
			if faultNear || !anyHealthy || len(replicas) == 0 {
				excused++
				continue
			}
			vs = append(vs, violation(checkWebhook, "%s %s of %s at %s refused for webhook unavailability while a replica was healthy: %s",
				kind, o.invoke.ID, o.invoke.Resource, stamp3(from), o.done.Detail))
		}
	}
	return vs, refused, excused
}
