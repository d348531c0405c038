package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// handoffTarget is the p99 bound on release->Held and expiry->Held that a
// manager replica fault must not break (docs/ha.md).
const handoffTarget = 2 * time.Second

// stall is one stretch of the grant path with an eligible waiter and
// nobody Held: from the predecessor's release request or expiry to the
// successor's grantedAt.
type stall struct {
	d     time.Duration
	cause string
}

// noteStall keeps the longest stall, with its cause: how the holder ended
// and any manager replica fault between the holder's end and the grant.
func (r *Report) noteStall(w *world, res, how, pred string, from, to time.Time) {
	d := to.Sub(from)
	if d <= r.Longest.d {
		return
	}
	cause := fmt.Sprintf("%s of %s on %s", how, pred, res)
	var faults []string
	for _, e := range w.events {
		if e.Op != NoteFault || !strings.Contains(e.Detail, "manager-") {
			continue
		}
		// A fault up to a failover's length before the stall began can
		// still be the reason.
		if e.Time.After(from.Add(-20*time.Second)) && e.Time.Before(to) {
			faults = append(faults, fmt.Sprintf("%s at %s", e.Detail, e.Time.Sub(from).Round(time.Millisecond)))
		}
	}
	if len(faults) > 0 {
		cause += "; manager faults around it (relative to its start): " + strings.Join(faults, ", ")
	} else {
		cause += "; no manager fault around it"
	}
	r.Longest = stall{d: d, cause: cause}
}

// printTargets prints the grant path's targets and its longest stall.
func (r *Report) printTargets(out io.Writer) {
	for _, t := range []struct {
		name string
		ds   []time.Duration
	}{{"release -> Held", r.HandoffRelease}, {"expiry -> Held", r.HandoffExpiry}} {
		s := sorted(t.ds)
		if len(s) == 0 {
			fmt.Fprintf(out, "Target %s p99 <= %s: no handoffs\n", t.name, handoffTarget)
			continue
		}
		p99 := percentile(s, 0.99)
		verdict := "met"
		if p99 > handoffTarget {
			verdict = "MISSED"
		}
		fmt.Fprintf(out, "Target %s p99 <= %s: %s (p99 %s)\n", t.name, handoffTarget, verdict, p99.Round(time.Millisecond))
	}
	fmt.Fprintf(out, "Longest grant-path stall (a waiter eligible, nobody Held): %s, %s\n", r.Longest.d.Round(time.Millisecond), r.Longest.cause)
}
