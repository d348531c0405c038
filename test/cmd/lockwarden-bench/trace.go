package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// quiesce is how long a traced handoff waits after the waiter held before
// its closing scrape, so that the follow-up work (the old holder's status,
// Events, the reconciles the controller's own writes trigger) is counted.
const quiesce = 150 * time.Millisecond

// tracer breaks traced lockwarden handoffs down: an admin watch on the
// namespace's grants and FenceCounters timestamps each step, and scrapes of
// the API server's and the manager's metrics before the release and after
// the handoff count the requests, webhook calls, storage operations, watch
// events and reconciles each handoff costs.
type tracer struct {
	cs  kubernetes.Interface
	mgr *managerProc
	cpu *cpuMeter

	// CPU seconds by process at the last before, and summed over the
	// traced handoffs.
	cpuBefore, cpuSum map[string]float64

	mu           sync.Mutex
	heldSeen     map[string]time.Time // grant name -> first seen Held
	releasedSeen map[string]time.Time // grant name -> first seen Released
	counterSeen  map[string]time.Time // grant name -> first counter naming it holder

	apiBefore, mgrBefore promScrape
	api, mgrSum          promScrape // summed deltas
	n                    int
	steps                map[string]*series
}

// Metric families the breakdown reads.
var (
	apiMetrics = []string{"apiserver_request_total", "apiserver_admission_webhook_admission_duration_seconds_",
		"apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count",
		"apiserver_request_sli_duration_seconds_sum", "apiserver_request_sli_duration_seconds_count",
		"etcd_request_duration_seconds_count", "apiserver_watch_events_total"}
	mgrMetrics = []string{"controller_runtime_reconcile_total", "controller_runtime_reconcile_time_seconds_",
		"workqueue_queue_duration_seconds_", "workqueue_work_duration_seconds_", "rest_client_requests_total",
		"controller_runtime_webhook_latency_seconds_"}
)

// Steps of the timeline, in order.
var traceSteps = []string{
	"release call returned",
	"FenceCounter names the waiter (admin watch)",
	"waiter's grant Held (admin watch)",
	"waiter observed Held (its own watch)",
	"old grant Released (admin watch)",
}

func newTracer(ctx context.Context, cp *controlPlane, mgr *managerProc, cpu *cpuMeter, ns string) (*tracer, error) {
	cs, err := kubernetes.NewForConfig(cp.clientConfig())
	if err != nil {
		return nil, err
	}
	t := &tracer{cs: cs, mgr: mgr, cpu: cpu, cpuSum: map[string]float64{}, heldSeen: map[string]time.Time{}, releasedSeen: map[string]time.Time{},
		counterSeen: map[string]time.Time{}, api: promScrape{}, mgrSum: promScrape{}, steps: map[string]*series{}}
	for _, s := range traceSteps {
		t.steps[s] = &series{system: "lockwarden", metric: s}
	}
	c, err := cp.newClient()
	if err != nil {
		return nil, err
	}
	if _, err := watchLoop(ctx, c, &lockingv1alpha1.LockGrantList{}, []client.ListOption{client.InNamespace(ns)}, func(o client.Object, at time.Time) {
		g := o.(*lockingv1alpha1.LockGrant)
		t.mu.Lock()
		defer t.mu.Unlock()
		m := map[lockingv1alpha1.LockGrantPhase]map[string]time.Time{lockingv1alpha1.PhaseHeld: t.heldSeen, lockingv1alpha1.PhaseReleased: t.releasedSeen}[g.Status.Phase]
		if _, seen := m[g.Name]; m != nil && !seen {
			m[g.Name] = at
		}
	}); err != nil {
		return nil, err
	}
	if _, err := watchLoop(ctx, c, &lockingv1alpha1.FenceCounterList{}, []client.ListOption{client.InNamespace(ns)}, func(o client.Object, at time.Time) {
		fc := o.(*lockingv1alpha1.FenceCounter)
		t.mu.Lock()
		defer t.mu.Unlock()
		if h := fc.Spec.Holder; h != nil {
			if _, seen := t.counterSeen[h.Name]; !seen {
				t.counterSeen[h.Name] = at
			}
		}
	}); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *tracer) scrape(ctx context.Context) (api, mgr promScrape, err error) {
	raw, err := t.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("scraping the API server's metrics: %w", err)
	}
	m, err := t.mgr.metrics(ctx)
	if err != nil {
		return nil, nil, err
	}
	return parseProm(string(raw), apiMetrics...), parseProm(m, mgrMetrics...), nil
}

func (t *tracer) before(ctx context.Context, _ int) error {
	var err error
	t.apiBefore, t.mgrBefore, err = t.scrape(ctx)
	t.cpuBefore = t.cpu.sample(t.mgr)
	return err
}

// cpuRow is the CPU per traced handoff, from the release call until the
// quiet period after it ended (the closing scrape is not included).
func (t *tracer) cpuRow() cpuRow {
	r := cpuRow{what: "lockwarden, traced handoff (until " + quiesce.String() + " after)", perOp: map[string]float64{}}
	for p, v := range t.cpuSum {
		r.perOp[p] = 1000 * v / float64(max(t.n, 1))
	}
	return r
}

func (t *tracer) after(ctx context.Context, t0, released time.Time, cur, next *ticket) error {
	if err := sleep(ctx, quiesce); err != nil {
		return err
	}
	for p, v := range t.cpu.sample(t.mgr) {
		t.cpuSum[p] += v - t.cpuBefore[p]
	}
	api, mgr, err := t.scrape(ctx)
	if err != nil {
		return err
	}
	for k, v := range delta(t.apiBefore, api) {
		s := t.api[k]
		v.value += s.value
		t.api[k] = v
	}
	for k, v := range delta(t.mgrBefore, mgr) {
		s := t.mgrSum[k]
		v.value += s.value
		t.mgrSum[k] = v
	}
	t.n++
	t.mu.Lock()
	defer t.mu.Unlock()
	add := func(step string, at time.Time, ok bool) {
		if ok {
			t.steps[step].add(at.Sub(t0))
		}
	}
	add(traceSteps[0], released, true)
	at, ok := t.counterSeen[next.name]
	add(traceSteps[1], at, ok)
	at, ok = t.heldSeen[next.name]
	add(traceSteps[2], at, ok)
	add(traceSteps[3], next.heldAt, true)
	at, ok = t.releasedSeen[cur.name]
	add(traceSteps[4], at, ok)
	return nil
}

// dump writes every summed delta that is not zero, for the record.
func (t *tracer) dump(path string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Sums over %d traced handoffs of the metric deltas (API server, then manager)\n", t.n)
	for _, m := range []promScrape{t.api, t.mgrSum} {
		for _, k := range sortedKeys(m) {
			if v := m[k].value; v != 0 && !strings.Contains(k, "_bucket") {
				fmt.Fprintf(&b, "%s %g\n", k, v)
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// statusPuts is the LockGrant status writes per traced handoff.
func (t *tracer) statusPuts() float64 {
	if t.n == 0 {
		return 0
	}
	return t.api.sum("apiserver_request_total", map[string]string{"resource": "lockgrants", "subresource": "status", "verb": "PUT"})[""] / float64(t.n)
}

// markdown renders the breakdown.
func (t *tracer) markdown() string {
	if t.n == 0 {
		return ""
	}
	var b strings.Builder
	n := float64(t.n)
	fmt.Fprintf(&b, "### Where a lockwarden handoff's time goes (%d traced handoffs)\n\n", t.n)
	b.WriteString("Timeline, in ms after the holder's release call (the grants and the FenceCounter watched by an extra admin watch):\n\n")
	b.WriteString("| step | n | p50 | p90 | p99 |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, s := range traceSteps {
		sum := summarize(t.steps[s].ms)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", s, sum.n, ms(sum.p50), ms(sum.p90), ms(sum.p99))
	}
	fmt.Fprintf(&b, "\nPer handoff (mean over the traced handoffs; from the release call until %s after the waiter held, so the follow-up work is included), from the API server's metrics:\n\n", quiesce)
	b.WriteString("| API requests (verb resource[/subresource]) | per handoff | mean ms in the API server | of which outside webhooks |\n| --- | ---: | ---: | ---: |\n")
	reqs := t.api.sum("apiserver_request_total", nil, "verb", "resource", "subresource")
	durN := t.api.sum("apiserver_request_duration_seconds_count", nil, "verb", "resource", "subresource")
	durS := t.api.sum("apiserver_request_duration_seconds_sum", nil, "verb", "resource", "subresource")
	sliN := t.api.sum("apiserver_request_sli_duration_seconds_count", nil, "verb", "resource", "subresource")
	sliS := t.api.sum("apiserver_request_sli_duration_seconds_sum", nil, "verb", "resource", "subresource")
	meanMS := func(sum, count float64) string {
		if count == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", 1000*sum/count)
	}
	for _, k := range sortedKeys(reqs) {
		f := strings.Fields(k)
		if len(f) < 2 || f[1] == "" || reqs[k] < 0.1*n { // non-resource requests are the scrapes
			continue
		}
		label := f[0] + " " + f[1]
		if len(f) > 2 {
			label += "/" + f[2]
		}
		fmt.Fprintf(&b, "| %s | %.2f | %s | %s |\n", label, reqs[k]/n, meanMS(durS[k], durN[k]), meanMS(sliS[k], sliN[k]))
	}
	b.WriteString("\n| admission webhook calls (name operation) | per handoff | mean ms |\n| --- | ---: | ---: |\n")
	counts := t.api.sum("apiserver_admission_webhook_admission_duration_seconds_count", nil, "name", "operation", "type")
	sums := t.api.sum("apiserver_admission_webhook_admission_duration_seconds_sum", nil, "name", "operation", "type")
	for _, k := range sortedKeys(counts) {
		if counts[k] == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f |\n", k, counts[k]/n, 1000*sums[k]/counts[k])
	}
	b.WriteString("\n| storage (etcd) operations (operation type) | per handoff |\n| --- | ---: |\n")
	writeCounts(&b, t.api.sum("etcd_request_duration_seconds_count", nil, "operation", "type"), n, nil)
	b.WriteString("\n| watch events sent to all watchers (group resource) | per handoff |\n| --- | ---: |\n")
	writeCounts(&b, t.api.sum("apiserver_watch_events_total", nil, "group", "resource", "kind"), n, nil)

	b.WriteString("\nFrom the manager's metrics:\n\n| manager | per handoff |\n| --- | ---: |\n")
	rec := t.mgrSum.sum("controller_runtime_reconcile_total", map[string]string{"controller": "lockgrant"})[""]
	recN := t.mgrSum.sum("controller_runtime_reconcile_time_seconds_count", map[string]string{"controller": "lockgrant"})[""]
	recS := t.mgrSum.sum("controller_runtime_reconcile_time_seconds_sum", map[string]string{"controller": "lockgrant"})[""]
	qN := t.mgrSum.sum("workqueue_queue_duration_seconds_count", map[string]string{"name": "lockgrant"})[""]
	qS := t.mgrSum.sum("workqueue_queue_duration_seconds_sum", map[string]string{"name": "lockgrant"})[""]
	fmt.Fprintf(&b, "| lockgrant reconciles | %.2f |\n", rec/n)
	if recN > 0 {
		fmt.Fprintf(&b, "| mean reconcile time, ms | %.2f |\n", 1000*recS/recN)
	}
	if qN > 0 {
		fmt.Fprintf(&b, "| mean workqueue wait, ms | %.2f |\n", 1000*qS/qN)
	}
	for _, k := range sortedKeys(t.mgrSum.sum("rest_client_requests_total", nil, "method")) {
		v := t.mgrSum.sum("rest_client_requests_total", map[string]string{"method": k})[""]
		if v > 0 {
			fmt.Fprintf(&b, "| manager API requests, %s | %.2f |\n", k, v/n)
		}
	}
	return b.String()
}

func writeCounts(b *strings.Builder, m map[string]float64, n float64, label func(string) (string, bool)) {
	merged := map[string]float64{}
	for k, v := range m {
		if label != nil {
			l, ok := label(k)
			if !ok {
				continue
			}
			k = l
		}
		merged[strings.TrimSpace(k)] += v
	}
	for _, k := range sortedKeys(merged) {
		if merged[k] >= 0.1*n {
			fmt.Fprintf(b, "| %s | %.2f |\n", k, merged[k]/n)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return slices.Compact(keys)
}
