package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// row is one line of the table: a latency summary (ms) or a single value.
type row struct {
	system, metric string
	sum            summary // latency rows
	value          float64 // value rows (unit != "")
	unit           string
	// group: rows of one group are compared with each other's etcd mutex
	// and Lease lock rows.
	group          string
	higherIsBetter bool
}

// results collects everything a run measured.
type results struct {
	rows    []row
	all     []*series // every latency series, for samples.csv
	handoff []*series // for the plot
	// handoffChunks and statusChunks are each system's handoff summary per
	// interleaved chunk (counter follower, and status consumer).
	handoffChunks, statusChunks map[string][]summary
	expiry                      []*series
	breakdown                   string
	notes                       []string
	cpu                         []cpuRow

	// LockGrant status writes per handoff: with queueDepth waiters in line
	// (including the released client getting back in line), and in the
	// traced series (one waiter).
	deepStatusPuts, tracedStatusPuts float64
	// deepWrites is every API write per contended handoff with queueDepth
	// waiters in line (the released client's new request included), 409s
	// apart in deepConflicts; deepDetail its breakdown.
	deepWrites, deepConflicts float64
	deepDetail                string
	// deadAtRelease is the handoff past one waiter that died at the
	// moment of the release.
	deadAtRelease *summary

	scaleRSS  float64
	scaleLag  summary
	scaleLeft int

	// freeCycle is what one acquire+release cycle on a free resource costs
	// each system (the throughput phase on one resource).
	freeCycle []freeCycle
	// longQueue is the long-queue phase's result.
	longQueue *longQueueResult
	// permits are the permits phase's results, by count of permits.
	permits []permitsResult
}

// freeCycle is the cost of one acquire+release cycle on a free resource.
type freeCycle struct {
	system string
	// writes is API writes per cycle (apiserver_request_total), detail
	// their breakdown by resource and verb.
	writes float64
	// conflicts is the writes per cycle answered 409 Conflict, not in
	// writes.
	conflicts float64
	// deletesPerCycle is the retention deletes of the cycles' grants per
	// cycle, in writes.
	deletesPerCycle float64
	detail          string
	// cpu is the CPU of every process per cycle, ms.
	cpu float64
}

func newResults() *results {
	return &results{handoffChunks: map[string][]summary{}, statusChunks: map[string][]summary{}}
}

func (r *results) cycleCost(system string) *freeCycle {
	for i := range r.freeCycle {
		if r.freeCycle[i].system == system {
			return &r.freeCycle[i]
		}
	}
	return nil
}

func (r *results) latency(s *series, group string) {
	r.all = append(r.all, s)
	r.rows = append(r.rows, row{system: s.system, metric: s.metric, sum: summarize(s.ms), group: group})
}

func (r *results) value(system, metric string, v float64, unit, group string, higherIsBetter bool) {
	r.rows = append(r.rows, row{system: system, metric: metric, value: v, unit: unit, group: group, higherIsBetter: higherIsBetter})
}

func (r *results) find(system, group string) *row {
	for i := range r.rows {
		if r.rows[i].system == system && r.rows[i].group == group {
			return &r.rows[i]
		}
	}
	return nil
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	if math.Abs(v) >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func ratio(a, b float64) string {
	if b <= 0 || a < 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "—"
	}
	x := a / b
	if x >= 10 {
		return strconv.FormatFloat(x, 'f', 0, 64) + "×"
	}
	return strconv.FormatFloat(x, 'f', 2, 64) + "×"
}

// ratioCell compares row with the reference system's row of its group:
// p50 and p99 ratios for latencies, the value ratio for values.
func (r *results) ratioCell(x row, refSystem string) string {
	if x.system == refSystem {
		return "1×"
	}
	ref := r.find(refSystem, x.group)
	if ref == nil {
		return ""
	}
	if x.unit != "" {
		return ratio(x.value, ref.value)
	}
	return ratio(x.sum.p50, ref.sum.p50) + " / " + ratio(x.sum.p99, ref.sum.p99)
}

// table renders the markdown table.
func (r *results) table() string {
	var b strings.Builder
	b.WriteString("| system | metric | n | p50 | p90 | p99 | max | ratio to etcd mutex (p50 / p99) | ratio to Lease lock (p50 / p99) |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.rows {
		if x.unit != "" {
			v := strconv.FormatFloat(x.value, 'f', 1, 64)
			if x.unit == "objects" {
				v = strconv.FormatFloat(x.value, 'f', 0, 64)
			}
			fmt.Fprintf(&b, "| %s | %s | | %s %s | | | | %s | %s |\n", x.system, x.metric, v, x.unit,
				r.ratioCell(x, sysEtcd), r.ratioCell(x, sysLease))
			continue
		}
		fmt.Fprintf(&b, "| %s | %s (ms) | %d | %s | %s | %s | %s | %s | %s |\n", x.system, x.metric, x.sum.n,
			ms(x.sum.p50), ms(x.sum.p90), ms(x.sum.p99), ms(x.sum.max), r.ratioCell(x, sysEtcd), r.ratioCell(x, sysLease))
	}
	return b.String()
}

// target is one of the targets, judged on this run.
type target struct {
	what     string
	measured string
	met      bool
	known    bool
}

// chunkRatio is the median over the interleaved chunks of system's
// percentile q (p50 or p99) divided by the Lease lock's in the same chunk;
// the chunks' ratios are listed too. ok is false without chunks.
func chunkRatio(lw, lease []summary, q func(summary) float64) (median float64, each []float64, ok bool) {
	for i := range min(len(lw), len(lease)) {
		if d := q(lease[i]); d > 0 {
			each = append(each, q(lw[i])/d)
		}
	}
	if len(each) == 0 {
		return 0, nil, false
	}
	s := slices.Clone(each)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], each, true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, each, true
}

func ratios(each []float64) string {
	parts := make([]string, len(each))
	for i, x := range each {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64) + "×"
	}
	return strings.Join(parts, ", ")
}

func p50(s summary) float64 { return s.p50 }
func p99(s summary) float64 { return s.p99 }

// targets judges this run against the grant path's targets
// (docs/bench.md): each met or missed, with its figure.
func (r *results) targets(o options) []target {
	var ts []target
	lease := r.handoffChunks[sysLease]
	for _, sys := range []string{sysLockwarden, sysLockwardenDelete} {
		lw := r.handoffChunks[sys]
		if m, each, ok := chunkRatio(lw, lease, p50); ok {
			ts = append(ts, target{fmt.Sprintf("handoff p50 ≤ 1.5 × the Lease lock's (%s; median of %d chunks' ratios)", sys, len(each)),
				fmt.Sprintf("%.2f× (chunks %s)", m, ratios(each)), m <= 1.5, true})
		}
		if m, each, ok := chunkRatio(lw, lease, p99); ok {
			ts = append(ts, target{fmt.Sprintf("handoff p99 ≤ 2.0 × the Lease lock's (%s; median of %d chunks' ratios)", sys, len(each)),
				fmt.Sprintf("%.2f× (chunks %s)", m, ratios(each)), m <= 2.0, true})
		}
		if m, each, ok := chunkRatio(r.statusChunks[sys], lease, p50); ok {
			ts = append(ts, target{fmt.Sprintf("status-consumer handoff p50 ≤ 2.5 × the Lease lock's (%s; median of %d chunks' ratios)", sys, len(each)),
				fmt.Sprintf("%.2f× (chunks %s)", m, ratios(each)), m <= 2.5, true})
		}
	}
	for _, x := range r.rows {
		if x.group == "admission-overhead" && strings.Contains(x.metric, "(Update, fence)") {
			ts = append(ts,
				target{"guarded-write admission overhead p50 ≤ 2 ms", fmt.Sprintf("%s ms", ms(x.sum.p50)), x.sum.p50 <= 2, true},
				target{"guarded-write admission overhead p99 ≤ 5 ms", fmt.Sprintf("%s ms", ms(x.sum.p99)), x.sum.p99 <= 5, true})
		}
	}
	l := r.cycleCost(sysLease)
	if c := r.cycleCost(sysLockwarden); c != nil && l != nil {
		ts = append(ts,
			target{"API writes per acquire+release cycle on a free resource ≤ 5, counting the eventual delete", fmt.Sprintf("%.2f (Lease lock %.2f): %s", c.writes, l.writes, c.detail), c.writes <= 5, true},
			target{"409 Conflict answers per cycle ≤ 0.05 (free resource)", fmt.Sprintf("%.3f", c.conflicts), c.conflicts <= 0.05, true},
			target{"CPU per acquire+release cycle ≤ 4 × the Lease lock's (all processes)", fmt.Sprintf("%.1f ms vs %.1f ms (%s)", c.cpu, l.cpu, ratio(c.cpu, l.cpu)), c.cpu <= 4*l.cpu, true})
	}
	if c := r.cycleCost(sysLockwardenDelete); c != nil && l != nil {
		ts = append(ts,
			target{"API writes per cycle on a free resource ≤ 4, releasing by delete", fmt.Sprintf("%.2f: %s", c.writes, c.detail), c.writes <= 4, true},
			target{"CPU per cycle ≤ 4 × the Lease lock's, releasing by delete", fmt.Sprintf("%.1f ms vs %.1f ms (%s)", c.cpu, l.cpu, ratio(c.cpu, l.cpu)), c.cpu <= 4*l.cpu, true})
	}
	if r.deepWrites > 0 {
		del := 0.0
		if c := r.cycleCost(sysLockwarden); c != nil {
			del = c.deletesPerCycle
		}
		w := r.deepWrites + del
		ts = append(ts,
			target{fmt.Sprintf("API writes per contended handoff ≤ 4 (%d waiters in line, counting the eventual delete)", queueDepth),
				fmt.Sprintf("%.2f: %s, and %.2f eventual delete", w, r.deepDetail, del), w <= 4, true},
			target{"409 Conflict answers per contended handoff ≤ 0.05", fmt.Sprintf("%.3f", r.deepConflicts), r.deepConflicts <= 0.05, true})
	}
	lwT, leaseT := r.find(sysLockwarden, fmt.Sprintf("tp-%d", o.parallel)), r.find(sysLease, fmt.Sprintf("tp-%d", o.parallel))
	if lwT != nil && leaseT != nil {
		ts = append(ts, target{fmt.Sprintf("throughput with %d resources ≥ 0.25 × the Lease lock's", o.parallel),
			fmt.Sprintf("%.1f vs %.1f cycles/s (%s)", lwT.value, leaseT.value, ratio(lwT.value, leaseT.value)), lwT.value >= leaseT.value/4, true})
	}
	if d := r.deadAtRelease; d != nil {
		ts = append(ts, target{"a waiter ahead dies at the moment of the release: the next live waiter holds within 2 s (max)",
			fmt.Sprintf("max %s ms (p50 %s ms)", ms(d.max), ms(d.p50)), d.max <= 2000, true})
	}
	if q := r.longQueue; q != nil {
		ts = append(ts,
			target{fmt.Sprintf("kept: long queue: handoff p50 with > %d waiting ≤ 1.5 × with < %d", longQueueDeep, longQueueShallow),
				fmt.Sprintf("%s ms vs %s ms (%s)", ms(q.deep.p50), ms(q.shallow.p50), ratio(q.deep.p50, q.shallow.p50)), q.deep.p50 <= 1.5*q.shallow.p50, true},
			target{"kept: long queue: API writes per handoff independent of the queue's length",
				fmt.Sprintf("%.2f with > %d waiting, %.2f with < %d", q.deepWrites, longQueueDeep, q.shallowWrites, longQueueShallow),
				q.deepWrites <= q.shallowWrites+0.5, true})
	}
	if r.scaleRSS > 0 {
		ts = append(ts,
			target{fmt.Sprintf("kept: %d live grants: controller RSS < 256 MiB", o.scale), fmt.Sprintf("%.0f MiB", r.scaleRSS), r.scaleRSS < 256, true},
			target{fmt.Sprintf("kept: %d live grants: request-to-Held p99 < 100 ms on a free resource", o.scale), fmt.Sprintf("%s ms (p50 %s ms)", ms(r.scaleLag.p99), ms(r.scaleLag.p50)), r.scaleLag.p99 < 100, true},
			target{"kept: finished grants garbage-collected after the retention", fmt.Sprintf("%d left", r.scaleLeft), r.scaleLeft == 0, true})
	}
	return ts
}

func targetsMarkdown(ts []target) string {
	var b strings.Builder
	b.WriteString("| target | measured | |\n| --- | --- | --- |\n")
	for _, t := range ts {
		verdict := "MISSED"
		if t.met {
			verdict = "met"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.what, t.measured, verdict)
	}
	return b.String()
}

// writeCSV writes every sample: system, metric, milliseconds.
func (r *results) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"system", "metric", "ms"})
	for _, s := range r.all {
		for _, v := range s.ms {
			_ = w.Write([]string{s.system, s.metric, strconv.FormatFloat(v, 'f', 3, 64)})
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeMarkdown writes the whole report.
func (r *results) writeMarkdown(w io.Writer, o options, machine, started, incomplete string) {
	fmt.Fprintf(w, "# lockwarden bench, %s\n\n", started)
	if incomplete != "" {
		fmt.Fprintf(w, "**INCOMPLETE RUN**: %s\n\n", incomplete)
	}
	fmt.Fprintf(w, "Machine: %s; load average at the end %s.\n\n", machine, loadavg())
	fmt.Fprintf(w, "Sizes: %d handoffs per system (leader election at its defaults: %d), %d expiry rounds per system, %s throughput windows on 1 and %d resources, %d admission write triples, %d floor samples, %d live grants over %d resources, %d probes, scale-phase retention %s.\n\n",
		o.handoffs, o.leDefaultRounds, o.expiryRounds, o.window, o.parallel, o.admission, o.floors, o.scale, o.scale/o.grantsPerRes, o.probes, o.retention)
	if len(r.rows) > 0 {
		fmt.Fprint(w, r.table())
		fmt.Fprintln(w)
	}
	if ts := r.targets(o); len(ts) > 0 {
		fmt.Fprint(w, targetsMarkdown(ts))
		fmt.Fprintln(w)
	}
	if len(r.permits) > 0 {
		fmt.Fprint(w, permitsMarkdown(r.permits, o.window))
		fmt.Fprintln(w)
	}
	for _, s := range r.all {
		neg := 0
		for _, v := range s.ms {
			if v < 0 {
				neg++
			}
		}
		if neg > 0 {
			r.notes = append(r.notes, fmt.Sprintf("%s, %s: %d of %d samples are negative: the successor observed itself holding before the old holder's lease had expired by the holder's own record.", s.system, s.metric, neg, len(s.ms)))
		}
	}
	if r.deepStatusPuts > 0 {
		one := "see the breakdown"
		if r.tracedStatusPuts > 0 {
			one = fmt.Sprintf("%.1f", r.tracedStatusPuts)
		}
		r.notes = append(r.notes, fmt.Sprintf("Handoff with %d waiters in line: %.1f LockGrant status writes per handoff, counting the released client's new request getting in line (one waiter, traced, the new request not counted: %s).",
			queueDepth, r.deepStatusPuts, one))
	}
	for _, n := range r.notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	if len(r.notes) > 0 {
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, cpuMarkdown(r.cpu))
	if r.breakdown != "" {
		fmt.Fprint(w, r.breakdown)
	}
}
