package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// System names, as the table shows them.
const (
	sysLockwarden = "lockwarden"
	// sysLockwardenDelete is lockwarden with the holder releasing by
	// deleting its grant (pkg/lock's WithReleaseByDelete).
	sysLockwardenDelete = "lockwarden, release by delete"
	sysEtcd             = "etcd mutex"
	sysLease            = "Lease lock"
	sysAPIServer        = "kube-apiserver"
	sysEtcdRaw          = "etcd"
)

func sysLE(t leTiming) string { return "leader election " + t.String() }

// Namespaces of the phases; each phase has its own, so that one phase's
// finished grants never slow another's reconciles.
const (
	nsFloor      = "bench-floor"
	nsHandoff    = "bench-handoff"
	nsTraced     = "bench-traced"
	nsExpiry     = "bench-expiry"
	nsThroughput = "bench-throughput"
	nsAdmission  = "bench-admission"
	nsScale      = "bench-scale"
	nsPermits    = "bench-permits"
)

var benchNamespaces = []string{nsFloor, nsHandoff, nsTraced, nsExpiry, nsThroughput, nsPermits, nsAdmission, nsScale, nsDeadWaiters, nsLongQueue, nsFailover}

// bench holds what every phase uses, and collects the results.
type bench struct {
	o     options
	cp    *controlPlane
	admin client.WithWatch
	mgr   *managerProc
	dir   string
	res   *results
	// managerRestart restarts the manager with another retention and
	// replica count.
	managerRestart func(ctx context.Context, retention time.Duration, replicas int) error
	// replicas is how many replicas the running manager has.
	replicas int
	cpu      *cpuMeter
}

// floors measures the raw floors: sequential etcd Puts of one key, and
// sequential API-server Updates of one Lease.
func (b *bench) floors(ctx context.Context) error {
	cli, err := newEtcd(b.cp.etcdURL)
	if err != nil {
		return err
	}
	defer cli.Close()
	put := &series{system: sysEtcdRaw, metric: "Put (raw floor)"}
	for i := range b.o.floors + 20 {
		t0 := time.Now()
		if _, err := cli.Put(ctx, etcdPrefix+"floor", strconv.Itoa(i)); err != nil {
			return fmt.Errorf("etcd put: %w", err)
		}
		if i >= 20 {
			put.add(time.Since(t0))
		}
	}
	b.res.latency(put, "floor-etcd")

	c, err := b.cp.newClient()
	if err != nil {
		return err
	}
	le := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "floor", Namespace: nsFloor},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("floor"), LeaseDurationSeconds: ptr.To[int32](15)}}
	if err := c.Create(ctx, le); err != nil {
		return err
	}
	upd := &series{system: sysAPIServer, metric: "Update of a Lease (raw floor)"}
	for i := range b.o.floors + 20 {
		now := metav1.NewMicroTime(time.Now())
		le.Spec.RenewTime = &now
		t0 := time.Now()
		if err := c.Update(ctx, le); err != nil {
			return fmt.Errorf("updating the floor Lease: %w", err)
		}
		if i >= 20 {
			upd.add(time.Since(t0))
		}
	}
	b.res.latency(upd, "floor-api")
	return nil
}

// pair is two clients of one system for handoffs.
type pair struct {
	system string
	a, b   lockClient
	// resource each chunk hands off.
	resource string
	s        *series
	// status is lockwarden's status-consumer handoff (nil for others).
	status *series
	// chunks and statusChunks summarize each interleaved chunk alone.
	chunks, statusChunks []summary
}

// handoffChunks is how many interleaved chunks the handoff phase runs;
// the ratio targets are judged on the median of the chunks' ratios.
const handoffChunks = 3

// handoff measures o.handoffs handoffs of lockwarden (released by setting
// spec.release, and by deleting the grant), the etcd mutex, the Lease lock
// and leader election at 1s/800ms/100ms, in handoffChunks interleaved chunks
// so that a slow stretch of the machine hits every system alike, and then a
// few handoffs of leader election at its defaults.
func (b *bench) handoff(ctx context.Context) error {
	var pairs []*pair
	defer func() {
		for _, p := range pairs {
			p.a.Close()
			p.b.Close()
		}
	}()
	metric := "handoff: release → waiter holds"
	lwA, err := newLWClient(ctx, b.cp, nsHandoff, "a", 60)
	if err != nil {
		return err
	}
	lwB, err := newLWClient(ctx, b.cp, nsHandoff, "b", 60)
	if err != nil {
		return err
	}
	pairs = append(pairs, &pair{system: sysLockwarden, a: lwA, b: lwB, resource: "handoff"})
	ldA, err := newLWClient(ctx, b.cp, nsHandoff, "del-a", 60)
	if err != nil {
		return err
	}
	ldB, err := newLWClient(ctx, b.cp, nsHandoff, "del-b", 60)
	if err != nil {
		return err
	}
	ldA.releaseByDelete, ldB.releaseByDelete = true, true
	pairs = append(pairs, &pair{system: sysLockwardenDelete, a: ldA, b: ldB, resource: "handoff-delete"})
	etA, err := newEtcdClient(b.cp.etcdURL, 0)
	if err != nil {
		return err
	}
	etB, err := newEtcdClient(b.cp.etcdURL, 0)
	if err != nil {
		return err
	}
	pairs = append(pairs, &pair{system: sysEtcd, a: etA, b: etB, resource: "handoff"})
	lsA, err := newLeaseClient(b.cp, nsHandoff, "a", 15)
	if err != nil {
		return err
	}
	lsB, err := newLeaseClient(b.cp, nsHandoff, "b", 15)
	if err != nil {
		return err
	}
	pairs = append(pairs, &pair{system: sysLease, a: lsA, b: lsB, resource: "handoff"})
	leA, err := newLEClient(b.cp, nsHandoff, "a", leFast, true)
	if err != nil {
		return err
	}
	leB, err := newLEClient(b.cp, nsHandoff, "b", leFast, true)
	if err != nil {
		return err
	}
	pairs = append(pairs, &pair{system: sysLE(leFast), a: leA, b: leB, resource: "le-fast"})
	for _, p := range pairs {
		p.s = &series{system: p.system, metric: metric}
		if _, ok := p.a.(*lwClient); ok {
			p.status = &series{system: p.system, metric: "handoff, status consumer: release → waiter's grant status Held"}
		}
	}

	for c := range handoffChunks {
		n := b.o.handoffs / handoffChunks
		if c == handoffChunks-1 {
			n = b.o.handoffs - n*(handoffChunks-1)
		}
		order := rand.Perm(len(pairs))
		for _, i := range order {
			p := pairs[i]
			fmt.Printf("    %-32s chunk %d/%d: %d handoffs\n", p.system, c+1, handoffChunks, n)
			chunk := &series{system: p.system, metric: metric}
			var status *series
			if p.status != nil {
				status = &series{system: p.system, metric: p.status.metric}
			}
			if err := handoffs(ctx, p.a, p.b, p.resource, n, chunk, status, nil); err != nil {
				return fmt.Errorf("%s: %w", p.system, err)
			}
			p.s.ms = append(p.s.ms, chunk.ms...)
			p.chunks = append(p.chunks, summarize(chunk.ms))
			if status != nil {
				p.status.ms = append(p.status.ms, status.ms...)
				p.statusChunks = append(p.statusChunks, summarize(status.ms))
			}
		}
	}
	for _, p := range pairs {
		b.res.latency(p.s, "handoff")
		b.res.handoff = append(b.res.handoff, p.s)
		b.res.handoffChunks[p.system] = p.chunks
	}
	for _, p := range pairs {
		if p.status != nil {
			b.res.latency(p.status, "handoff-status")
			b.res.statusChunks[p.system] = p.statusChunks
		}
	}

	fmt.Printf("    %-32s %d handoffs, %d waiters in line\n", sysLockwarden, b.o.handoffs/3, queueDepth)
	if err := b.deepQueue(ctx, max(b.o.handoffs/3, 5)); err != nil {
		return err
	}

	dA, err := newLEClient(b.cp, nsHandoff, "a", leDefault, true)
	if err != nil {
		return err
	}
	dB, err := newLEClient(b.cp, nsHandoff, "b", leDefault, true)
	if err != nil {
		return err
	}
	s := &series{system: sysLE(leDefault), metric: metric}
	fmt.Printf("    %-32s %d handoffs\n", s.system, b.o.leDefaultRounds)
	if err := handoffs(ctx, dA, dB, "le-default", b.o.leDefaultRounds, s, nil, nil); err != nil {
		return fmt.Errorf("%s: %w", s.system, err)
	}
	b.res.latency(s, "handoff")
	b.res.handoff = append(b.res.handoff, s)
	return nil
}

// traced runs lockwarden handoffs one by one with the path breakdown.
func (b *bench) traced(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t, err := newTracer(ctx, b.cp, b.mgr, b.cpu, nsTraced)
	if err != nil {
		return err
	}
	a, err := newLWClient(ctx, b.cp, nsTraced, "a", 60)
	if err != nil {
		return err
	}
	defer a.Close()
	c, err := newLWClient(ctx, b.cp, nsTraced, "b", 60)
	if err != nil {
		return err
	}
	defer c.Close()
	s := &series{system: sysLockwarden, metric: "handoff, traced (scrapes around each)"}
	status := &series{system: sysLockwarden, metric: "handoff, traced, status consumer: release → waiter's grant status Held"}
	if err := handoffs(ctx, a, c, "traced", b.o.tracedHandoffs, s, status, t); err != nil {
		return err
	}
	b.res.latency(status, "traced-status")
	b.res.cpu = append(b.res.cpu, t.cpuRow())
	b.res.latency(s, "traced")
	b.res.breakdown = t.markdown()
	b.res.tracedStatusPuts = t.statusPuts()
	return t.dump(filepath.Join(b.dir, "traced-metrics.txt"))
}

// expiry measures expiry handoffs: lockwarden (1 s leases), the etcd mutex
// (2 s session leases, etcd's minimum), the Lease lock (1 s) and leader
// election at 1s/800ms/100ms.
func (b *bench) expiry(ctx context.Context) error {
	metric := "expiry handoff: expiresAt → successor holds"
	type run struct {
		system, resource string
		holder, waiter   func() (lockClient, error)
		hold             time.Duration
	}
	runs := []run{
		{sysLockwarden, "expiry-lw", func() (lockClient, error) { return newLWClient(ctx, b.cp, nsExpiry, "holder", 1) },
			func() (lockClient, error) { return newLWClient(ctx, b.cp, nsExpiry, "waiter", 60) }, 0},
		{sysLockwarden + ", lock-delay 1 s", "expiry-lw-delay", func() (lockClient, error) {
			c, err := newLWClient(ctx, b.cp, nsExpiry, "delayed", 1)
			if c != nil {
				c.lockDelay = 1
			}
			return c, err
		}, func() (lockClient, error) { return newLWClient(ctx, b.cp, nsExpiry, "after-delay", 60) }, 0},
		{sysEtcd, "expiry-etcd", func() (lockClient, error) { return newEtcdClient(b.cp.etcdURL, 2) },
			func() (lockClient, error) { return newEtcdClient(b.cp.etcdURL, 0) }, 0},
		{sysLease, "expiry-lease", func() (lockClient, error) { return newLeaseClient(b.cp, nsExpiry, "holder", 1) },
			func() (lockClient, error) { return newLeaseClient(b.cp, nsExpiry, "waiter", 15) }, 0},
		{sysLE(leFast), "expiry-le", func() (lockClient, error) { return newLEClient(b.cp, nsExpiry, "holder", leFast, false) },
			func() (lockClient, error) { return newLEClient(b.cp, nsExpiry, "waiter", leFast, true) }, 150 * time.Millisecond},
	}
	for _, r := range runs {
		h, err := r.holder()
		if err != nil {
			return err
		}
		w, err := r.waiter()
		if err != nil {
			h.Close()
			return err
		}
		s := &series{system: r.system, metric: metric}
		fmt.Printf("    %-32s %d rounds\n", r.system, b.o.expiryRounds)
		err = expiries(ctx, h, w, r.resource, b.o.expiryRounds, r.hold, s)
		h.Close()
		w.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", r.system, err)
		}
		b.res.latency(s, "expiry")
		b.res.expiry = append(b.res.expiry, s)
	}
	return nil
}

// cycleRetention is the manager's --finished-grant-retention in the
// throughput phase: short, so that each finished grant's delete, which a
// cluster pays an hour later at the default retention, lands in or just
// after the window and is counted in the writes and the CPU per cycle.
const cycleRetention = 2 * time.Second

// throughput measures acquire+release cycles per second on 1 resource and
// on o.parallel resources in parallel (one worker each), for lockwarden,
// the etcd mutex and the Lease lock; on 1 resource also for lockwarden
// releasing by delete. The manager runs with cycleRetention, so that the
// eventual delete of each finished grant is counted: after lockwarden's
// window on 1 resource, the phase waits until the window's grants are
// deleted and adds those deletes to the window's writes. With several
// replica counts (--replicas 1,2), lockwarden is measured with each, back
// to back, the manager restarted in between.
func (b *bench) throughput(ctx context.Context) error {
	api, err := newAPIScraper(b.cp)
	if err != nil {
		return err
	}
	retention := defaultRetention
	defer func() {
		if b.replicas != b.o.replicas[0] || retention != defaultRetention {
			_ = b.managerRestart(context.WithoutCancel(ctx), defaultRetention, b.o.replicas[0])
		}
	}()
	for _, width := range []int{1, b.o.parallel} {
		type sys struct {
			name     string
			replicas int // 0: no manager involved
			mk       func(i int) (lockClient, error)
			// actor names the lockwarden clients' grants (label actorLabel).
			actor func(i int) string
		}
		systems := []sys{
			{sysEtcd, 0, func(int) (lockClient, error) { return newEtcdClient(b.cp.etcdURL, 0) }, nil},
			{sysLease, 0, func(i int) (lockClient, error) { return newLeaseClient(b.cp, nsThroughput, "w"+strconv.Itoa(i), 15) }, nil},
		}
		for k, n := range b.o.replicas {
			name := sysLockwarden
			if k > 0 {
				name = fmt.Sprintf("%s, %d replicas", sysLockwarden, n)
			}
			actor := func(i int) string { return fmt.Sprintf("w%d-r%d-%d", width, n, i) }
			systems = append(systems, sys{name, n, func(i int) (lockClient, error) {
				return newLWClient(ctx, b.cp, nsThroughput, actor(i), 60)
			}, actor})
			if k == 0 && width == 1 {
				del := func(i int) string { return fmt.Sprintf("w%d-r%d-del-%d", width, n, i) }
				systems = append(systems, sys{sysLockwardenDelete, n, func(i int) (lockClient, error) {
					c, err := newLWClient(ctx, b.cp, nsThroughput, del(i), 60)
					if c != nil {
						c.releaseByDelete = true
					}
					return c, err
				}, del})
			}
		}
		var base *cpuRow
		for _, sy := range systems {
			if sy.replicas > 0 && (sy.replicas != b.replicas || retention != cycleRetention) {
				fmt.Printf("    restarting the manager with %d replica(s), retention %s\n", sy.replicas, cycleRetention)
				if err := b.managerRestart(ctx, cycleRetention, sy.replicas); err != nil {
					return err
				}
				retention = cycleRetention
			}
			clients := make([]lockClient, 0, width)
			resources := make([]string, 0, width)
			for i := range width {
				c, err := sy.mk(i)
				if err != nil {
					return err
				}
				clients = append(clients, c)
				resources = append(resources, fmt.Sprintf("tp%d-r%d-%s-%d", width, sy.replicas, map[bool]string{true: "del", false: "set"}[sy.name == sysLockwardenDelete], i))
			}
			lat := &series{system: sy.name, metric: fmt.Sprintf("cycle latency, %d resource(s)", width)}
			fmt.Printf("    %-32s %d resource(s), %s\n", sy.name, width, b.o.window)
			api0, err := api.scrape(ctx)
			if err != nil {
				return err
			}
			cpu0 := b.cpu.sample(b.mgr)
			rate, err := cycles(ctx, clients, resources, b.o.window, lat)
			var api1, api2 promScrape
			if width == 1 && err == nil {
				if api1, err = api.scrape(ctx); err == nil && sy.actor != nil {
					// The finished grants are deleted once cycleRetention has
					// passed: wait for that, for the writes.
					err = b.awaitCollected(ctx, nsThroughput, sy.actor(0), cycleRetention+time.Minute)
				}
				if err == nil {
					api2, err = api.scrape(ctx)
				}
			}
			what := fmt.Sprintf("%s, acquire+release cycle, %d resource(s)", sy.name, width)
			if sy.replicas > 0 && len(b.o.replicas) > 1 && sy.replicas == b.o.replicas[0] {
				what = fmt.Sprintf("%s, %d replica(s), acquire+release cycle, %d resource(s)", sy.name, sy.replicas, width)
			}
			row := cpuPerOp(what, cpu0, b.cpu.sample(b.mgr), len(lat.ms)+width)
			b.res.cpu = append(b.res.cpu, row)
			if width == 1 && err == nil {
				// API writes per cycle on a free resource, from the API
				// server's own counters (everything written in the window,
				// the controller's writes included, and the deletes of the
				// window's grants that landed after it), and CPU per cycle
				// (the window and the wait for those deletes).
				w := writesBetween(api0, api1)
				if sy.actor != nil {
					const del = "lockgrants DELETE"
					after := writesBetween(api1, api2)
					// The grant of the warm-up cycle is deleted in the window
					// too: at most one delete per measured cycle counts.
					w.replace(del, min(w.by[del]+after.by[del], float64(len(lat.ms))))
				}
				per, detail := w.per(len(lat.ms))
				fc := freeCycle{system: sy.name, writes: per, conflicts: w.conflictsPer(len(lat.ms)), detail: detail, cpu: row.total()}
				if n := len(lat.ms); n > 0 && sy.name != sysLockwardenDelete {
					fc.deletesPerCycle = w.by["lockgrants DELETE"] / float64(n)
				}
				b.res.freeCycle = append(b.res.freeCycle, fc)
			}
			for _, c := range clients {
				c.Close()
			}
			if err != nil {
				return fmt.Errorf("%s, %d resources: %w", sy.name, width, err)
			}
			b.res.value(sy.name, fmt.Sprintf("throughput, %d resource(s)", width), rate, "cycles/s", fmt.Sprintf("tp-%d", width), true)
			b.res.latency(lat, fmt.Sprintf("tp-lat-%d", width))
			switch {
			case sy.replicas == 0 || sy.name == sysLockwardenDelete:
			case base == nil:
				base = &row
			default:
				b.res.notes = append(b.res.notes, fmt.Sprintf("CPU per acquire+release cycle, %d resource(s), %d vs %d replicas: manager %.2f vs %.2f ms (%.2f×), all processes %.2f vs %.2f ms (%.2f×; target at most 1.2×).",
					width, sy.replicas, b.o.replicas[0], row.perOp["manager"], base.perOp["manager"], row.perOp["manager"]/base.perOp["manager"],
					row.total(), base.total(), row.total()/base.total()))
			}
		}
	}
	return nil
}

// awaitCollected waits until no LockGrant of actor is left in ns (the
// manager deletes finished grants once their retention passed), for up to
// timeout.
func (b *bench) awaitCollected(ctx context.Context, ns, actor string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var list lockingv1alpha1.LockGrantList
		if err := b.admin.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{actorLabel: actor}); err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d grants of %s not deleted %s after the window", len(list.Items), actor, timeout)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// sizes describes what one grant costs to store and to send to each
// watcher: a Held LockGrant and its FenceCounter as JSON, with the share of
// managedFields, next to a Lease.
func (b *bench) sizes(ctx context.Context, g *lockingv1alpha1.LockGrant) string {
	size := func(o client.Object) (total, mf int) {
		j, _ := json.Marshal(o)
		m, _ := json.Marshal(o.GetManagedFields())
		return len(j), len(m)
	}
	gt, gm := size(g)
	fc := &lockingv1alpha1.FenceCounter{}
	_ = b.admin.Get(ctx, client.ObjectKey{Namespace: g.Namespace, Name: lockingv1alpha1.FenceCounterName(g.Spec.Resource)}, fc)
	ft, fm := size(fc)
	le := &coordinationv1.Lease{}
	_ = b.admin.Get(ctx, client.ObjectKey{Namespace: nsHandoff, Name: leaseName("handoff")}, le)
	lt, lm := size(le)
	return fmt.Sprintf("Object sizes (JSON as a watcher receives it; managedFields in parentheses): a Held LockGrant %d B (%d B), its FenceCounter %d B (%d B), the Lease lock's Lease %d B (%d B); the record is in status twice, as status.record and inside status.proof (%d B).",
		gt, gm, ft, fm, lt, lm, len(g.Status.Proof))
}

// admission measures the same Update of a ConfigMap guarded (label,
// resource, grant and fence annotations), guarded with the grant's signed
// proof as well, and unguarded (same annotations, no label: no webhook is
// called), interleaved in random order.
func (b *bench) admission(ctx context.Context) error {
	l, err := newLWClient(ctx, b.cp, nsAdmission, "writer", 3600)
	if err != nil {
		return err
	}
	defer l.Close()
	t, err := l.Request(ctx, "admission")
	if err != nil {
		return err
	}
	if err := t.waitHeld(ctx, holdTimeout); err != nil {
		return err
	}
	g := l.heldGrant(ctx, t)
	if g == nil {
		return fmt.Errorf("the admission grant never showed its status")
	}
	c, err := b.cp.newClient()
	if err != nil {
		return err
	}
	b.res.notes = append(b.res.notes, b.sizes(ctx, g))
	ann := map[string]string{
		lockingv1alpha1.ResourceAnnotation: "admission",
		lockingv1alpha1.GrantAnnotation:    g.Name,
		lockingv1alpha1.FenceAnnotation:    strconv.FormatInt(g.Status.FenceToken, 10),
	}
	withProof := map[string]string{lockingv1alpha1.ProofAnnotation: g.Status.Proof}
	for k, v := range ann {
		withProof[k] = v
	}
	guarded := map[string]string{lockingv1alpha1.GuardedLabel: "true"}
	objs := []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: nsAdmission, Labels: guarded, Annotations: ann}},
		{ObjectMeta: metav1.ObjectMeta{Name: "guarded-proof", Namespace: nsAdmission, Labels: guarded, Annotations: withProof}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unguarded", Namespace: nsAdmission, Annotations: withProof}},
	}
	claims := []map[string]string{ann, withProof, withProof}
	ss := []*series{
		{system: sysLockwarden, metric: "guarded write (Update, fence)"},
		{system: sysLockwarden, metric: "guarded write (Update, fence + signed proof)"},
		{system: sysAPIServer, metric: "unguarded write (same Update, no label)"},
	}
	for _, o := range objs {
		o.Data = map[string]string{"v": "0"}
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("creating ConfigMap %s: %w", o.Name, err)
		}
	}
	for i := range b.o.admission + 20 {
		for _, k := range rand.Perm(len(objs)) {
			objs[k].Data["v"] = strconv.Itoa(i + 1)
			// Every guarded write carries its own claim: admission consumed
			// the last one. The unguarded object gets the same annotations,
			// so the three Updates send the same bytes.
			for key, v := range claims[k] {
				objs[k].Annotations[key] = v
			}
			t0 := time.Now()
			if err := c.Update(ctx, objs[k]); err != nil {
				return fmt.Errorf("updating ConfigMap %s: %w", objs[k].Name, err)
			}
			if i >= 20 {
				ss[k].add(time.Since(t0))
			}
		}
	}
	for _, s := range ss {
		b.res.latency(s, "admission")
	}
	plain := summarize(ss[2].ms)
	for _, s := range ss[:2] {
		g := summarize(s.ms)
		// Differences of percentiles; a difference of maxima means nothing.
		b.res.rows = append(b.res.rows, row{system: sysLockwarden, metric: "admission overhead: " + s.metric[len("guarded write "):] + " − unguarded",
			sum: summary{n: g.n, p50: g.p50 - plain.p50, p90: g.p90 - plain.p90, p99: g.p99 - plain.p99, max: math.NaN()}, group: "admission-overhead"})
	}
	return t.release(ctx)
}
