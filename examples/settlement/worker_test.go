package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
	"github.com/lockwarden/lockwarden/internal/test/pgtest"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// The worker end to end against a real kube-apiserver and a real
// PostgreSQL: it acquires its grant through the API server, settles the
// batch, and releases. A second run of the same batch, under the next
// fence, settles nothing twice.
//
// The lockwarden controller's own behaviour is tested in test/integration;
// here a stand-in grants each LockGrant as the controller does (the next
// fence in the resource's FenceCounter, then status Held), so that this
// test exercises the worker's Kubernetes code path on its own.
func TestWorkerEndToEnd(t *testing.T) {
	dsn := pgtest.Database(t)
	cfg, admin := startKube(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "billing"}}); err != nil {
		t.Fatal(err)
	}
	go standIn(ctx, t, admin, "billing")

	c := config{cluster: testCluster, namespace: "billing", dsn: dsn, batch: "2026-07-19", invoices: 7, segmentSize: 3, ttlSeconds: 60}
	var out bytes.Buffer
	if err := c.runWith(ctx, cfg, &out); err != nil {
		t.Fatalf("first run: %v\n%s", err, out.String())
	}
	for _, line := range []string{"fence 1", "segment 1/3 settled: 3 invoices", "segment 3/3 settled: 1 invoices", "batch 2026-07-19 settled", "released"} {
		if !strings.Contains(out.String(), line) {
			t.Fatalf("first run's report lacks %q:\n%s", line, out.String())
		}
	}
	out.Reset()
	if err := c.runWith(ctx, cfg, &out); err != nil {
		t.Fatalf("second run: %v\n%s", err, out.String())
	}
	for _, line := range []string{"fence 2", "segment 1/3 already settled under fence 1", "segment 3/3 already settled under fence 1"} {
		if !strings.Contains(out.String(), line) {
			t.Fatalf("second run's report lacks %q:\n%s", line, out.String())
		}
	}

	db, err := postgres.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n, fences int
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT fence) FROM settlement_invoices WHERE batch = '2026-07-19'`).Scan(&n, &fences); err != nil {
		t.Fatal(err)
	}
	if n != 7 || fences != 1 {
		t.Fatalf("settled %d invoices under %d fences; want 7 under one", n, fences)
	}
	grants := &lockingv1alpha1.LockGrantList{}
	if err := admin.List(ctx, grants, client.InNamespace("billing")); err != nil {
		t.Fatal(err)
	}
	b, _ := newBatch(c.batch, c.invoices, c.segmentSize)
	for _, g := range grants.Items {
		if !g.Spec.Release || g.Spec.OperationRoot != b.root {
			t.Fatalf("grant %s: release %v, operation root %q; want released and bound to %s", g.Name, g.Spec.Release, g.Spec.OperationRoot, b.root)
		}
	}
}

// The worker run with --namespace default (twice: fences 1 and 2), then
// with --namespace billing (fence 1 from billing's own counter), against
// one database. Both namespaces settle the whole batch; billing's fence 1
// is not taken for a regression of default's fence 2: no alarm row, no
// fence-regression report on the grant.
func TestWorkerInTwoNamespacesOnOneDatabase(t *testing.T) {
	dsn := pgtest.Database(t)
	cfg, admin := startKube(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "billing"}}); err != nil {
		t.Fatal(err)
	}
	go standIn(ctx, t, admin, "default")
	go standIn(ctx, t, admin, "billing")

	run := func(ns string, want ...string) {
		t.Helper()
		c := config{cluster: testCluster, namespace: ns, dsn: dsn, batch: "2026-07-19", invoices: 7, segmentSize: 3, ttlSeconds: 60}
		var out bytes.Buffer
		if err := c.runWith(ctx, cfg, &out); err != nil {
			t.Fatalf("run in %s: %v\n%s", ns, err, out.String())
		}
		for _, line := range want {
			if !strings.Contains(out.String(), line) {
				t.Fatalf("run in %s: the report lacks %q:\n%s", ns, line, out.String())
			}
		}
	}
	run("default", "held default/", "fence 1", "segment 3/3 settled")
	run("default", "fence 2", "segment 3/3 already settled under fence 1")
	run("billing", "held billing/", "fence 1", "segment 1/3 settled: 3 invoices", "segment 3/3 settled: 1 invoices", "batch 2026-07-19 settled")

	db, err := postgres.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var alarms int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM lockwarden_fence_alarms`).Scan(&alarms); err != nil || alarms != 0 {
		t.Fatalf("%d fence regression alarms, %v; want none", alarms, err)
	}
	for ns, want := range map[string]int64{"default": 2, "billing": 1} {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM settlement_invoices WHERE namespace = $1`, ns).Scan(&n); err != nil || n != 7 {
			t.Fatalf("namespace %s: %d invoices settled, %v; want 7", ns, n, err)
		}
		store := postgres.New(db, nil, postgres.WithCluster(testCluster))
		l, err := store.Ledger(ctx, postgres.Key{Namespace: ns, Resource: "invoice-batch/2026-07-19"})
		if err != nil || l.Fence != want || l.LastSeq != 3 {
			t.Fatalf("namespace %s: ledger %+v, %v; want fence %d at segment 3", ns, l, err, want)
		}
		grants := &lockingv1alpha1.LockGrantList{}
		if err := admin.List(ctx, grants, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, g := range grants.Items {
			if v, ok := g.Annotations[lockingv1alpha1.FenceRegressionAnnotation]; ok {
				t.Fatalf("grant %s/%s was reported as a fence regression: %s", ns, g.Name, v)
			}
		}
	}
}

// startKube starts a kube-apiserver and etcd with lockwarden's CRDs and
// returns the admin's config and client. It skips without the binaries,
// except in CI.
func startKube(t *testing.T) (*rest.Config, client.WithWatch) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no kube-apiserver in %s: %v", assets, err)
		}
		t.Skipf("no kube-apiserver in %s (run `make tools`): %v", assets, err)
	}
	env := envtest.StartControlPlane(t)
	admin, err := client.NewWithWatch(env.Config, client.Options{Scheme: scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return env.Config, admin
}

// standIn grants every LockGrant of ns as the controller would, one at a
// time: a released grant frees the resource, and the next request gets the
// next fence.
func standIn(ctx context.Context, t *testing.T, c client.WithWatch, ns string) {
	w, err := c.Watch(ctx, &lockingv1alpha1.LockGrantList{}, client.InNamespace(ns))
	if err != nil {
		t.Errorf("stand-in controller: %v", err)
		return
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			g, isGrant := ev.Object.(*lockingv1alpha1.LockGrant)
			if !isGrant || ev.Type == watch.Deleted {
				continue
			}
			if err := standInReconcile(ctx, c, g.DeepCopy()); err != nil && ctx.Err() == nil {
				t.Errorf("stand-in controller: %v", err)
			}
		}
	}
}

func standInReconcile(ctx context.Context, c client.Client, g *lockingv1alpha1.LockGrant) error {
	// Events can be stale: act on the grant as it is now.
	if err := c.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
		return err
	}
	now := metav1.NowMicro()
	switch {
	case g.Spec.Release && g.Status.Phase == lockingv1alpha1.PhaseHeld:
		counter := &lockingv1alpha1.FenceCounter{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: g.Namespace, Name: lockingv1alpha1.FenceCounterName(g.Spec.Resource)}, counter); err != nil {
			return err
		}
		counter.Spec.Holder = nil
		if err := c.Update(ctx, counter); err != nil {
			return err
		}
		g.Status.Phase, g.Status.EndedAt = lockingv1alpha1.PhaseReleased, &now
		return c.Status().Update(ctx, g)
	case g.Status.Phase != "":
		return nil
	}
	if g.Spec.Owner == "" {
		g.Spec.Owner = "system:serviceaccount:billing:settlement"
		if err := c.Update(ctx, g); err != nil {
			return err
		}
	}
	counter := &lockingv1alpha1.FenceCounter{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: lockingv1alpha1.FenceCounterName(g.Spec.Resource)}}
	if err := c.Get(ctx, client.ObjectKeyFromObject(counter), counter); err != nil {
		counter.Spec.Resource = g.Spec.Resource
		if err := c.Create(ctx, counter); err != nil {
			return err
		}
	}
	if h := counter.Spec.Holder; h == nil || h.UID != string(g.UID) {
		counter.Spec.Fence++
		counter.Spec.Holder = &lockingv1alpha1.FenceHolder{Name: g.Name, UID: string(g.UID), Owner: g.Spec.Owner, Fence: counter.Spec.Fence}
		if err := c.Update(ctx, counter); err != nil {
			return err
		}
	}
	expires := metav1.NewMicroTime(now.Add(time.Duration(g.Spec.LeaseDurationSeconds) * time.Second))
	g.Status.Phase, g.Status.FenceToken, g.Status.GrantedAt, g.Status.ExpiresAt = lockingv1alpha1.PhaseHeld, counter.Spec.Fence, &now, &expires
	return c.Status().Update(ctx, g)
}
