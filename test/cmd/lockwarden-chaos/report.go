package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Report is the checker's verdict on a history, with the numbers behind it.
type Report struct {
	// Violations lists every broken rule; the history passes without any.
	Violations []Violation
	// Checked maps each check to what it looked at.
	Checked map[string]string

	Span       time.Duration
	Workers    int
	Ops        map[string]map[string]int // op -> outcome (or refusal reason) -> count
	Grants     map[string]int            // final phase -> count
	Faults     map[string]int
	Failovers  []time.Duration
	Objects    map[string]int64 // final count
	Ambiguous  int              // writes of unknown outcome
	AmbApplied int              // ... that took effect
	// Late counts the writes invoked after their grant had expired, ended
	// or been superseded, by outcome (refusal reason, "info", "accepted").
	Late map[string]int
	// Handoff latencies, from the predecessor's release request or expiry
	// to the successor's grantedAt, for successors already waiting.
	HandoffRelease, HandoffExpiry []time.Duration
	// Longest is the longest of those handoffs, with its cause.
	Longest stall
	// Unknown are the times from a local deadline to the read that settled
	// OWNERSHIP_UNKNOWN; Unresolved counts those never settled.
	Unknown    []time.Duration
	UnknownEnd map[string]int
	Unresolved int
	// WebhookRefused counts requests the API server refused because no
	// admission webhook answered, by operation; WebhookExcused the guarded
	// writes among them refused at a replica fault or with no replica
	// healthy.
	WebhookRefused map[string]int
	WebhookExcused int

	illegal []illegal
}

// Passed reports whether every check holds.
func (r *Report) Passed() bool { return len(r.Violations) == 0 }

// Check checks a history (events in time order).
func Check(history []Event) *Report {
	w := index(history)
	r := &Report{
		Checked: map[string]string{}, Ops: map[string]map[string]int{}, Grants: map[string]int{},
		Faults: map[string]int{}, Objects: map[string]int64{}, UnknownEnd: map[string]int{},
		Late: map[string]int{},
	}
	r.Violations = append(r.Violations, w.checkFenceOrder()...)
	r.Violations = append(r.Violations, w.checkLostWrites()...)
	r.Violations = append(r.Violations, w.checkStaleWrites()...)
	r.Violations = append(r.Violations, w.checkStrays()...)
	r.Violations = append(r.Violations, w.checkOneHeld()...)
	lin, lockOps, regOps, bad := w.linearizable()
	r.Violations = append(r.Violations, lin...)
	r.illegal = bad
	r.Violations = append(r.Violations, w.checkRunSound()...)
	webhookVs, refused, excused := w.checkWebhookAvailable()
	r.Violations = append(r.Violations, webhookVs...)
	r.WebhookRefused, r.WebhookExcused = refused, excused

	versions, held := 0, 0
	for _, vs := range w.versions {
		versions += len(vs)
	}
	for _, g := range w.grants {
		r.Grants[g.phase]++
		if g.held() {
			held++
		}
	}
	r.Checked[checkFences] = fmt.Sprintf("%d versions of %d objects", versions, len(w.versions))
	r.Checked[checkNoLoss] = fmt.Sprintf("%d versions against %d writes", versions, len(w.opsOf[OpWrite]))
	r.Checked[checkNoStale] = fmt.Sprintf("%d accepted writes against %d grants", versions, len(w.grants))
	r.Checked[checkNoStray] = fmt.Sprintf("%d stray requests", len(w.opsOf[OpStray]))
	r.Checked[checkOneHeld] = fmt.Sprintf("%d Held grants on %d resources", held, len(w.resources()))
	r.Checked[checkLockModel] = fmt.Sprintf("%d operations", lockOps)
	r.Checked[checkRegister] = fmt.Sprintf("%d operations", regOps)
	r.Checked[checkWebhook] = fmt.Sprintf("%d guarded writes refused for webhook unavailability, %d of them at a replica fault or with none healthy", refused[OpWrite]+refused[OpStray], excused)
	r.Checked[checkRun] = fmt.Sprintf("%d observer gaps, %d failover timeouts", len(w.gaps), len(w.notes[NoteFailoverTimeout]))

	r.stats(w)
	return r
}

func (r *Report) stats(w *world) {
	var first, last time.Time
	procs := map[string]bool{}
	for _, o := range w.ops {
		if first.IsZero() || o.invoke.Time.Before(first) {
			first = o.invoke.Time
		}
		if o.done != nil && o.done.Time.After(last) {
			last = o.done.Time
		}
		procs[o.invoke.Proc] = true
		outcome := o.outcome()
		if o.done != nil && o.done.Reason != "" {
			outcome = o.done.Reason
		}
		if r.Ops[o.invoke.Op] == nil {
			r.Ops[o.invoke.Op] = map[string]int{}
		}
		r.Ops[o.invoke.Op][outcome]++
	}
	r.Span, r.Workers = last.Sub(first), len(procs)

	applied := map[string]bool{}
	for obj, vs := range w.versions {
		for _, v := range vs {
			applied[v.WriteID] = true
		}
		if f, ok := w.final[obj]; ok {
			r.Objects[obj] = f.Count
		}
	}
	for _, o := range w.opsOf[OpWrite] {
		if o.outcome() == EventInfo {
			r.Ambiguous++
			if applied[o.invoke.ID] {
				r.AmbApplied++
			}
		}
		if w.late(o) != "" {
			switch {
			case applied[o.invoke.ID]:
				r.Late["ACCEPTED"]++
			case o.outcome() == EventFail:
				r.Late[o.done.Reason]++
			default:
				r.Late["unknown-not-applied"]++
			}
		}
	}

	var leaderKill time.Time
	for _, e := range w.events {
		switch e.Op {
		case NoteFault:
			kind, _, _ := strings.Cut(e.Detail, " ")
			if kind == "freeze" && strings.Contains(e.Detail, "manager-") {
				kind = "freeze-manager"
			}
			if kind == "freeze" && strings.Contains(e.Detail, "before its write") {
				kind = "freeze-before-write"
			}
			if kind == "kill" {
				kind = "kill-follower"
				if strings.Contains(e.Detail, "(leader)") {
					kind, leaderKill = "kill-leader", e.Time
				}
			}
			r.Faults[kind]++
		case NoteFailover:
			if !leaderKill.IsZero() {
				r.Failovers = append(r.Failovers, e.Time.Sub(leaderKill))
				leaderKill = time.Time{}
			}
		}
	}

	r.handoffs(w)
	r.unknowns(w)
}

// handoffs measures, for each grant whose successor was already waiting,
// the time from the release request (or the expiry) to the successor's
// grantedAt.
func (r *Report) handoffs(w *world) {
	for _, res := range w.resources() {
		gs := w.heldGrants(res)
		for i := 1; i < len(gs); i++ {
			p, s := gs[i-1], gs[i]
			var from time.Time
			switch {
			case p.phase == "Expired" && p.expiresAt != nil:
				from = *p.expiresAt
			case p.phase == "Released":
				rel := w.firstOp(OpRelease, p.name)
				if rel == nil {
					continue
				}
				from = rel.invoke.Time
			default:
				continue
			}
			requested := s.created
			if a := w.firstOp(OpAcquire, s.name); a != nil {
				requested = &a.invoke.Time
			}
			if requested == nil || requested.After(from) {
				continue // nobody was waiting
			}
			d := max(s.grantedAt.Sub(from), 0)
			how := "release"
			if p.phase == "Expired" {
				how = "expiry"
			}
			r.noteStall(w, res, how, p.name, from, *s.grantedAt)
			if p.phase == "Expired" {
				r.HandoffExpiry = append(r.HandoffExpiry, d)
			} else {
				r.HandoffRelease = append(r.HandoffRelease, d)
			}
		}
	}
}

// unknowns pairs each worker's entries into OWNERSHIP_UNKNOWN with the
// settlement that followed.
func (r *Report) unknowns(w *world) {
	open := map[string]Event{}
	for _, e := range w.events {
		key := e.Proc + "/" + e.Grant
		switch e.Op {
		case NoteUnknownBegin:
			open[key] = e
		case NoteUnknownEnd:
			b, ok := open[key]
			if !ok {
				continue
			}
			delete(open, key)
			from := b.Time
			if b.Deadline != nil {
				from = *b.Deadline
			}
			r.Unknown = append(r.Unknown, max(e.Time.Sub(from), 0))
			r.UnknownEnd[e.Reason]++
		}
	}
	r.Unresolved = len(open)
}

// Print writes the report.
func (r *Report) Print(out io.Writer) {
	fmt.Fprintf(out, "Chaos history: %s of workload, %d workers, %d grants (%s)\n", r.Span.Round(time.Second), r.Workers, sum(r.Grants), counts(r.Grants))
	fmt.Fprintf(out, "Faults: %s\n", counts(r.Faults))
	fmt.Fprintf(out, "Leader failovers: %d, kill to new leader %s\n", len(r.Failovers), dist(r.Failovers))
	for _, kind := range []string{OpAcquire, OpRenew, OpRelease, OpRead, OpWrite, OpStray} {
		fmt.Fprintf(out, "  %-8s %s\n", kind, counts(r.Ops[kind]))
	}
	fmt.Fprintf(out, "Writes of unknown outcome: %d, of which %d took effect\n", r.Ambiguous, r.AmbApplied)
	fmt.Fprintf(out, "Refused for webhook unavailability (fail closed): %d guarded writes (%d at a replica fault or with no replica healthy); other requests: %s\n",
		r.WebhookRefused[OpWrite]+r.WebhookRefused[OpStray], r.WebhookExcused,
		counts(map[string]int{OpAcquire: r.WebhookRefused[OpAcquire], OpRenew: r.WebhookRefused[OpRenew], OpRelease: r.WebhookRefused[OpRelease]}))
	fmt.Fprintf(out, "Late writes (invoked after their grant expired, ended or was superseded): %d: %s\n", sum(r.Late), counts(r.Late))
	objs := make([]string, 0, len(r.Objects))
	for _, k := range sortedKeys(r.Objects) {
		objs = append(objs, fmt.Sprintf("%s=%d", k, r.Objects[k]))
	}
	fmt.Fprintf(out, "Final counters: %s\n", strings.Join(objs, " "))
	fmt.Fprintf(out, "Handoff latency, release -> successor Held: %s\n", dist(r.HandoffRelease))
	fmt.Fprintf(out, "Handoff latency, expiry  -> successor Held: %s\n", dist(r.HandoffExpiry))
	r.printTargets(out)
	fmt.Fprintf(out, "OWNERSHIP_UNKNOWN, local deadline -> settled: %s; settled as %s; unresolved %d\n",
		dist(r.Unknown), counts(r.UnknownEnd), r.Unresolved)

	fmt.Fprintln(out, "Checks:")
	failed := map[string]int{}
	for _, v := range r.Violations {
		failed[v.Check]++
	}
	for _, c := range []string{checkFences, checkNoLoss, checkNoStale, checkNoStray, checkOneHeld, checkLockModel, checkRegister, checkWebhook, checkRun} {
		verdict := "ok"
		if failed[c] > 0 {
			verdict = fmt.Sprintf("FAILED (%d)", failed[c])
		}
		fmt.Fprintf(out, "  %-62s %-11s %s\n", c, verdict, r.Checked[c])
	}
	const shown = 40
	for i, v := range r.Violations {
		if i == shown {
			fmt.Fprintf(out, "  ... and %d more\n", len(r.Violations)-shown)
			break
		}
		fmt.Fprintf(out, "  VIOLATION [%s] %s\n", v.Check, v.Detail)
	}
}

// dist formats n, p50, p99 and max of ds.
func dist(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	s := sorted(ds)
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(s),
		percentile(s, 0.50).Round(time.Millisecond), percentile(s, 0.99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// sorted returns a sorted copy of ds.
func sorted(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

// percentile returns the nearest-rank q-quantile of sorted s.
func percentile(s []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b.WriteString(" ")
		}
		name := k
		if name == "" {
			name = "none"
		}
		fmt.Fprintf(&b, "%s=%d", name, m[k])
	}
	return b.String()
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
