package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
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
	rows      []row
	all       []*series // every latency series, for samples.csv
	handoff   []*series // for the plot
	expiry    []*series
	breakdown string
	notes     []string
	cpu       []cpuRow

	// LockGrant status writes per handoff: with queueDepth waiters in line
	// (including the released client getting back in line), and in the
	// traced series (one waiter).
	deepStatusPuts, tracedStatusPuts float64

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
	detail string
	// cpu is the CPU of every process per cycle, ms.
	cpu float64
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

func (r *results) targets(o options) []target {
	var ts []target
	lw, lease := r.find(sysLockwarden, "handoff"), r.find(sysLease, "handoff")
	if lw != nil && lease != nil {
		ts = append(ts,
			target{"1. handoff p50 ≤ 1.0 × the Lease lock's", fmt.Sprintf("%s ms vs %s ms (%s)", ms(lw.sum.p50), ms(lease.sum.p50), ratio(lw.sum.p50, lease.sum.p50)), lw.sum.p50 <= lease.sum.p50, true},
			target{"1. handoff p99 ≤ 1.0 × the Lease lock's", fmt.Sprintf("%s ms vs %s ms (%s)", ms(lw.sum.p99), ms(lease.sum.p99), ratio(lw.sum.p99, lease.sum.p99)), lw.sum.p99 <= lease.sum.p99, true})
	}
	if le := r.find(sysLE(leFast), "handoff"); lw != nil && le != nil {
		ts = append(ts, target{"2. handoff ≥ 10× faster than leader election 1s/800ms/100ms (p50 and p99)",
			fmt.Sprintf("p50 %s faster, p99 %s faster", ratio(le.sum.p50, lw.sum.p50), ratio(le.sum.p99, lw.sum.p99)),
			le.sum.p50 >= 10*lw.sum.p50 && le.sum.p99 >= 10*lw.sum.p99, true})
	}
	for _, x := range r.rows {
		if x.group == "admission-overhead" && strings.Contains(x.metric, "(Update, fence)") {
			ts = append(ts, target{"3. guarded-write admission overhead p99 ≤ 2 ms", fmt.Sprintf("%s ms (p50 %s ms)", ms(x.sum.p99), ms(x.sum.p50)), x.sum.p99 <= 2, true})
		}
	}
	if c, l := r.cycleCost(sysLockwarden), r.cycleCost(sysLease); c != nil && l != nil {
		ts = append(ts,
			target{"4. API writes per acquire+release cycle on a free resource ≤ 3", fmt.Sprintf("%.2f (Lease lock %.2f); %s", c.writes, l.writes, c.detail), c.writes <= 3, true},
			target{"5. CPU per acquire+release cycle ≤ 2 × the Lease lock's (all processes)", fmt.Sprintf("%.1f ms vs %.1f ms (%s)", c.cpu, l.cpu, ratio(c.cpu, l.cpu)), c.cpu <= 2*l.cpu, true})
	}
	lwT, leaseT := r.find(sysLockwarden, fmt.Sprintf("tp-%d", o.parallel)), r.find(sysLease, fmt.Sprintf("tp-%d", o.parallel))
	if lwT != nil && leaseT != nil {
		ts = append(ts, target{fmt.Sprintf("6. throughput with %d resources ≥ 0.5 × the Lease lock's", o.parallel),
			fmt.Sprintf("%.1f vs %.1f cycles/s (%s)", lwT.value, leaseT.value, ratio(lwT.value, leaseT.value)), lwT.value >= leaseT.value/2, true})
	}
	if q := r.longQueue; q != nil {
		ts = append(ts,
			target{fmt.Sprintf("7. long queue: handoff p50 with > %d waiting ≤ 1.5 × with < %d", longQueueDeep, longQueueShallow),
				fmt.Sprintf("%s ms vs %s ms (%s)", ms(q.deep.p50), ms(q.shallow.p50), ratio(q.deep.p50, q.shallow.p50)), q.deep.p50 <= 1.5*q.shallow.p50, true},
			target{"7. long queue: API writes per handoff independent of the queue's length",
				fmt.Sprintf("%.2f with > %d waiting, %.2f with < %d", q.deepWrites, longQueueDeep, q.shallowWrites, longQueueShallow),
				q.deepWrites <= q.shallowWrites+0.5, true})
	}
	if r.scaleRSS > 0 {
		ts = append(ts,
			target{fmt.Sprintf("8. %d live grants: controller RSS < 256 MiB", o.scale), fmt.Sprintf("%.0f MiB", r.scaleRSS), r.scaleRSS < 256, true},
			target{fmt.Sprintf("8. %d live grants: request-to-Held p99 < 100 ms on a free resource", o.scale), fmt.Sprintf("%s ms (p50 %s ms)", ms(r.scaleLag.p99), ms(r.scaleLag.p50)), r.scaleLag.p99 < 100, true},
			target{"8. finished grants garbage-collected after the retention", fmt.Sprintf("%d left", r.scaleLeft), r.scaleLeft == 0, true})
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
