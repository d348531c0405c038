package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// scaleWorkers is how many clients create and release the scale phase's
// grants concurrently.
const scaleWorkers = 16

// phaseBook follows every grant of a namespace through an admin watch.
type phaseBook struct {
	mu     sync.Mutex
	phase  map[string]lockingv1alpha1.LockGrantPhase
	heldAt map[string]time.Time
}

func watchPhases(ctx context.Context, c client.WithWatch, ns string) (*phaseBook, error) {
	pb := &phaseBook{phase: map[string]lockingv1alpha1.LockGrantPhase{}, heldAt: map[string]time.Time{}}
	_, err := watchLoop(ctx, c, &lockingv1alpha1.LockGrantList{}, []client.ListOption{client.InNamespace(ns)}, func(o client.Object, at time.Time) {
		g := o.(*lockingv1alpha1.LockGrant)
		pb.mu.Lock()
		defer pb.mu.Unlock()
		pb.phase[g.Name] = g.Status.Phase
		if _, seen := pb.heldAt[g.Name]; !seen && g.Status.Phase == lockingv1alpha1.PhaseHeld {
			pb.heldAt[g.Name] = at
		}
	})
	return pb, err
}

func (pb *phaseBook) count(phase lockingv1alpha1.LockGrantPhase) int {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	n := 0
	for _, p := range pb.phase {
		if p == phase {
			n++
		}
	}
	return n
}

type createdGrant struct {
	name string
	uid  types.UID
	at   time.Time // when its create was sent
}

// scale fills a namespace with o.scale live grants over
// o.scale/o.grantsPerRes resources (one Held and the rest waiting on each),
// measures the manager's memory and the request-to-Held lag of grants on
// free resources at that size, then releases everything and counts what the
// manager, run with --finished-grant-retention=o.retention, leaves behind.
func (b *bench) scale(ctx context.Context) error { //nolint:funlen // one measured phase top to bottom: fill, measure, release, count
	// The restarted manager's cache should hold this phase's grants only.
	fmt.Println("    deleting the grants of the earlier phases")
	earlier := []string{nsHandoff, nsTraced, nsExpiry, nsThroughput, nsAdmission}
	for _, ns := range earlier {
		if err := b.admin.DeleteAllOf(ctx, &lockingv1alpha1.LockGrant{}, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("deleting the grants of %s: %w", ns, err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, ns := range earlier {
			if n, err := b.countGrants(ctx, ns); err != nil || n > 0 {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("waiting for the earlier grants to go: %w", err)
	}
	fmt.Printf("    restarting the manager with --finished-grant-retention=%s\n", b.o.retention)
	if err := b.managerRestart(ctx, b.o.retention, b.o.replicas[0]); err != nil {
		return err
	}
	idle, _, err := b.mgr.memory()
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pb, err := watchPhases(ctx, b.admin, nsScale)
	if err != nil {
		return err
	}
	resources := b.o.scale / b.o.grantsPerRes
	total := resources * b.o.grantsPerRes
	grants := make([][]createdGrant, resources)
	for r := range grants {
		grants[r] = make([]createdGrant, b.o.grantsPerRes)
	}
	type job struct{ r, k int }
	jobs := make(chan job)
	var created atomic.Int64
	fillStart := time.Now()
	err = runWorkers(ctx, b.cp, jobs, func(ctx context.Context, c client.Client, j job) error {
		g := &lockingv1alpha1.LockGrant{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "s-", Namespace: nsScale},
			Spec:       lockingv1alpha1.LockGrantSpec{Resource: fmt.Sprintf("scale-%05d", j.r), LeaseDurationSeconds: 3600},
		}
		at := time.Now()
		if err := c.Create(ctx, g); err != nil {
			return fmt.Errorf("creating grant %d of resource %d: %w", j.k, j.r, err)
		}
		grants[j.r][j.k] = createdGrant{name: g.Name, uid: g.UID, at: at}
		if n := created.Add(1); n%2000 == 0 {
			fmt.Printf("    created %d/%d grants\n", n, total)
		}
		return nil
	}, func() {
		// Round by round: the first grant of every resource, then the second...
		for k := range b.o.grantsPerRes {
			for r := range resources {
				jobs <- job{r, k}
			}
		}
	})
	if err != nil {
		return err
	}
	createDur := time.Since(fillStart)
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		return pb.count(lockingv1alpha1.PhaseHeld) == resources && pb.count(lockingv1alpha1.PhasePending) == total-resources, nil
	}); err != nil {
		return fmt.Errorf("waiting for %d Held and %d Pending grants (have %d and %d): %w", resources, total-resources,
			pb.count(lockingv1alpha1.PhaseHeld), pb.count(lockingv1alpha1.PhasePending), err)
	}
	settled := time.Since(fillStart)
	fmt.Printf("    %d live grants (%d Held, %d Pending) after %.1fs (creates took %.1fs)\n", total, resources, total-resources, settled.Seconds(), createDur.Seconds())
	fill := &series{system: sysLockwarden, metric: fmt.Sprintf("scale fill, overloaded: request → Held, first grant of each resource, %d creators as fast as they can", scaleWorkers)}
	pb.mu.Lock()
	for r := range resources {
		g := grants[r][0]
		fill.add(pb.heldAt[g.name].Sub(g.at))
	}
	pb.mu.Unlock()
	b.res.latency(fill, "scale")
	b.res.value(sysLockwarden, "scale fill: grants created and settled per second", float64(total)/settled.Seconds(), "grants/s", "scale", true)

	// Probes: one request at a time on a free resource, with every grant
	// above live.
	probe, err := newLWClient(ctx, b.cp, nsScale, "probe", 60)
	if err != nil {
		return err
	}
	defer probe.Close()
	lag := &series{system: sysLockwarden, metric: fmt.Sprintf("reconcile lag at %d live grants: request → Held, free resource", total)}
	for i := range b.o.probes {
		t0 := time.Now()
		t, err := probe.Request(ctx, fmt.Sprintf("probe-%04d", i))
		if err != nil {
			return err
		}
		if err := t.waitHeld(ctx, holdTimeout); err != nil {
			return fmt.Errorf("probe %d: %w", i, err)
		}
		lag.add(t.heldAt.Sub(t0))
		if err := t.release(ctx); err != nil {
			return err
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	b.res.latency(lag, "scale-lag")
	rss, peak, err := b.mgr.memory()
	if err != nil {
		return err
	}
	b.res.value(sysLockwarden, "controller RSS, idle after restart", mib(idle), "MiB", "scale", false)
	b.res.value(sysLockwarden, fmt.Sprintf("controller RSS at %d live grants", total), mib(rss), "MiB", "scale", false)
	b.res.value(sysLockwarden, "controller peak RSS (VmHWM) so far", mib(peak), "MiB", "scale", false)
	b.res.scaleRSS, b.res.scaleLag = mib(rss), summarize(lag.ms)

	// Release everything, each resource's queue from its tail, so that no
	// waiter's queue position changes on the way.
	fmt.Printf("    releasing %d grants\n", total)
	releaseStart := time.Now()
	rjobs := make(chan int)
	err = runWorkers(ctx, b.cp, rjobs, func(ctx context.Context, c client.Client, r int) error {
		for k := b.o.grantsPerRes - 1; k >= 0; k-- {
			g := grants[r][k]
			patch := []byte(fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{"release":true}}`, g.uid))
			obj := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: g.name, Namespace: nsScale}}
			if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return fmt.Errorf("releasing %s: %w", g.name, err)
			}
		}
		return nil
	}, func() {
		for r := range resources {
			rjobs <- r
		}
	})
	if err != nil {
		return err
	}
	released := time.Now()
	fmt.Printf("    released in %.1fs; waiting for the collection (retention %s)\n", released.Sub(releaseStart).Seconds(), b.o.retention)
	deadline := b.o.retention + b.o.gcTimeout
	var left int
	var gone time.Duration
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, deadline, true, func(ctx context.Context) (bool, error) {
		n, err := b.countGrants(ctx, nsScale)
		if err != nil {
			return false, err
		}
		left, gone = n, time.Since(released)
		return n == 0, nil
	})
	if err != nil && ctx.Err() != nil {
		return err
	}
	counters, err := b.countList(ctx, nsScale, lockingv1alpha1.GroupVersion.WithKind("FenceCounterList"))
	if err != nil {
		return err
	}
	events, err := b.countList(ctx, nsScale, schema.GroupVersionKind{Group: "events.k8s.io", Version: "v1", Kind: "EventList"})
	if err != nil {
		return err
	}
	b.res.scaleLeft = left
	b.res.value(sysLockwarden, fmt.Sprintf("LockGrants left %s after the last release (retention %s)", gone.Round(time.Second), b.o.retention), float64(left), "objects", "scale", false)
	b.res.value(sysLockwarden, "FenceCounters left (kept by design: fences never reissued)", float64(counters), "objects", "scale", false)
	b.res.value(sysLockwarden, "Events left (expire by the API server's --event-ttl, 1h)", float64(events), "objects", "scale", false)
	rss, peak, err = b.mgr.memory()
	if err == nil {
		b.res.value(sysLockwarden, "controller RSS after the collection / peak (VmHWM)", mib(rss), "MiB", "scale", false)
		b.res.notes = append(b.res.notes, fmt.Sprintf("Scale phase: the manager's peak RSS (VmHWM) over the whole phase was %.0f MiB.", mib(peak)))
	}
	return nil
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// runWorkers runs fn on every job feed sends on jobs, on scaleWorkers
// clients with connections of their own, and returns the first error.
func runWorkers[J any](ctx context.Context, cp *controlPlane, jobs chan J, fn func(context.Context, client.Client, J) error, feed func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, scaleWorkers)
	var wg sync.WaitGroup
	for range scaleWorkers {
		c, err := cp.newClient()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if ctx.Err() != nil {
					continue // drain
				}
				if err := fn(ctx, c, j); err != nil {
					errs <- err
					cancel()
				}
			}
		}()
	}
	feed()
	close(jobs)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// countGrants counts the LockGrants of a namespace, from the API server.
func (b *bench) countGrants(ctx context.Context, ns string) (int, error) {
	return b.countList(ctx, ns, lockingv1alpha1.GroupVersion.WithKind("LockGrantList"))
}

// countList counts the objects of a kind in a namespace by paging through
// their metadata.
func (b *bench) countList(ctx context.Context, ns string, gvk schema.GroupVersionKind) (int, error) {
	n, cont := 0, ""
	for {
		l := &metav1.PartialObjectMetadataList{}
		l.SetGroupVersionKind(gvk)
		if err := b.admin.List(ctx, l, client.InNamespace(ns), client.Limit(500), client.Continue(cont)); err != nil {
			return 0, fmt.Errorf("listing %s in %s: %w", gvk.Kind, ns, err)
		}
		n += len(l.Items)
		if cont = l.Continue; cont == "" {
			return n, nil
		}
	}
}
