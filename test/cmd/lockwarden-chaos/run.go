package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// managerReplicas is how many manager replicas run.
const managerReplicas = 2

// run sets up the system, runs the workload under faults for o.duration,
// stops everything it started, and checks the history. The error is about
// the run itself (set-up, clean-up); the report says whether the history
// passed.
func run(ctx context.Context, o options) (*Report, error) { //nolint:funlen // one run top to bottom: set-up, workload, stop, check; its defers stop what it started
	dir, err := runDir(o.dir)
	if err != nil {
		return nil, err
	}
	fmt.Printf("Run directory (logs, kubeconfigs, history): %s\nSeed: %d\n", dir, o.seed)
	driverLog, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		return nil, err
	}
	defer driverLog.Close()
	logf.SetLogger(zap.New(zap.WriteTo(driverLog)))
	rec, err := newRecorder(filepath.Join(dir, "parts", "driver.jsonl"), "driver")
	if err != nil {
		return nil, err
	}
	defer rec.close()

	done := step("Starting a local control plane (etcd + kube-apiserver, envtest)")
	cp, err := localcp.Start(o.assets, o.crds, dir, newScheme())
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	done()
	admin, err := client.NewWithWatch(cp.AdminConfig, client.Options{Scheme: newScheme()})
	if err != nil {
		return nil, err
	}

	done = step(fmt.Sprintf("Starting %d manager replicas with leader election, each behind its own fault proxy to the API server, behind a webhook balancer", managerReplicas))
	apiURL, err := url.Parse(cp.AdminConfig.Host)
	if err != nil {
		return nil, err
	}
	apiAddr := apiURL.Host
	names := make([]string, managerReplicas)
	for i := range names {
		names[i] = fmt.Sprintf("manager-%d", i)
	}
	mnet, err := startFaultNetFor(apiAddr, names)
	if err != nil {
		return nil, err
	}
	defer mnet.close()
	var replicas []*replica
	var backends []backend
	for i := range managerReplicas {
		kubeconfig, err := proxiedKubeconfig(cp, names[i], mnet.url(i))
		if err != nil {
			return nil, err
		}
		r, err := newReplica(i, o.manager, kubeconfig, dir)
		if err != nil {
			return nil, err
		}
		replicas = append(replicas, r)
		backends = append(backends, backend{addr: r.webhookAddr(), probe: r.probeAddr()})
	}
	lb, err := startBalancer(backends)
	if err != nil {
		return nil, err
	}
	defer lb.close()
	if err := cp.ApplyLocalConfig(ctx, o.localConfig, lb.port()); err != nil {
		return nil, err
	}
	defer func() {
		for _, r := range replicas {
			r.stop()
		}
	}()
	if err := startReplicas(ctx, admin, replicas); err != nil {
		return nil, err
	}
	done()

	done = step(fmt.Sprintf("Starting %d worker processes behind fault proxies, contending for %d resources", o.workers, o.resources))
	fnet, err := startFaultNet(apiAddr, o.workers)
	if err != nil {
		return nil, err
	}
	defer fnet.close()
	servers := make([]string, o.workers)
	for i := range servers {
		servers[i] = fnet.url(i)
	}
	kubeconfigs, err := setupIdentities(ctx, cp, admin, servers)
	if err != nil {
		return nil, err
	}
	obsRec, err := newRecorder(filepath.Join(dir, "parts", "observer.jsonl"), "observer")
	if err != nil {
		return nil, err
	}
	defer obsRec.close()
	obsCtx, stopObserver := context.WithCancel(ctx)
	obs := startObserver(obsCtx, admin, obsRec)
	defer func() { stopObserver(); obs.wait() }()

	resources := make([]string, o.resources)
	for i := range resources {
		resources[i] = fmt.Sprintf("chaos/res-%d", i)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var workers []*workerProc
	defer func() {
		for _, wp := range workers {
			wp.stop()
		}
	}()
	for i := range o.workers {
		wp, err := startWorkerProc(self, i, kubeconfigs[i], dir, o, resources)
		if err != nil {
			return nil, err
		}
		workers = append(workers, wp)
	}
	done()

	chaosRec, err := newRecorder(filepath.Join(dir, "parts", "chaos.jsonl"), "chaos")
	if err != nil {
		return nil, err
	}
	defer chaosRec.close()
	c := &chaos{
		rnd: rand.New(rand.NewPCG(o.seed, 0x6368616f73)), rec: chaosRec, out: os.Stdout,
		workers: workers, net: fnet, mnet: mnet, replicas: replicas, obs: obs, admin: admin,
		ttl: o.ttl, killEvery: o.managerKillEvery,
	}
	done = step(fmt.Sprintf("Running the workload under faults for %s", o.duration))
	chaosCtx, stopChaos := context.WithTimeout(ctx, o.duration)
	c.run(chaosCtx)
	stopChaos()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	done()

	done = step("Healing every fault, stopping the workers, letting every grant end")
	if err := c.ensureReplicas(ctx); err != nil {
		rec.emit(Event{Kind: EventNote, Op: NoteManagerNotReady, Detail: err.Error()})
	}
	stopWorkers(workers, rec)
	// No worker traffic can arrive after this.
	fnet.close()
	live := quiesce(ctx, admin, 2*o.ttl+failoverTimeout)
	for _, g := range live {
		rec.emit(Event{Kind: EventNote, Op: NoteNotQuiesced, Detail: g})
	}
	final, err := recordFinal(ctx, admin, rec)
	if err != nil {
		return nil, err
	}
	for _, k := range obs.waitSeen(ctx, final, observerCatchUp) {
		rec.emit(Event{Kind: EventNote, Op: NoteGap, Detail: "the observer never saw the final version of " + k})
	}
	stopObserver()
	obs.wait()
	done()

	done = step("Checking the history")
	parts, err := partFiles(dir)
	if err != nil {
		return nil, err
	}
	history, err := readHistory(parts...)
	if err != nil {
		return nil, err
	}
	if err := writeHistory(filepath.Join(dir, "history.jsonl"), history); err != nil {
		return nil, err
	}
	rep := Check(history)
	if err := rep.WriteVisualizations(dir); err != nil {
		return nil, err
	}
	done()
	fmt.Println()
	rep.Print(os.Stdout)
	fmt.Printf("\nHistory: %s (re-check: lockwarden-chaos check --history %s)\n",
		filepath.Join(dir, "history.jsonl"), filepath.Join(dir, "history.jsonl"))
	return rep, nil
}

// proxiedKubeconfig writes a copy of the admin kubeconfig, named after a
// replica, whose server is the replica's fault proxy.
func proxiedKubeconfig(cp *localcp.ControlPlane, name, server string) (string, error) {
	return pointKubeconfig(cp, cp.AdminKubeconfig, name, server)
}

// pointKubeconfig writes a copy of the kubeconfig at src, named name, whose
// every cluster is reached at server (a fault proxy).
func pointKubeconfig(cp *localcp.ControlPlane, src, name, server string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(src)
	if err != nil {
		return "", err
	}
	for _, c := range cfg.Clusters {
		c.Server = server
	}
	kc, err := clientcmd.Write(*cfg)
	if err != nil {
		return "", err
	}
	return cp.WriteKubeconfig(name, kc)
}

// NoteNotQuiesced (driver): a grant had not ended long after the run.
const NoteNotQuiesced = "not-quiesced"

// runDir creates the run directory and its parts/ subdirectory.
func runDir(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "lockwarden-chaos-"); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "parts"), 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// stopWorkers stops every worker at once and records how each ended.
func stopWorkers(workers []*workerProc, rec *recorder) {
	var wg sync.WaitGroup
	for _, wp := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			how := wp.stop()
			rec.emit(Event{Kind: EventNote, Op: NoteWorkerExit, Detail: wp.name() + " " + how})
		}()
	}
	wg.Wait()
}

// observerCatchUp bounds the wait for the observer to have seen the state
// the final listing shows.
const observerCatchUp = time.Minute

// recordFinal records every grant and guarded object as they are after the
// run, and returns their resourceVersions by "kind/name".
func recordFinal(ctx context.Context, c client.Client, rec *recorder) (map[string]string, error) {
	final := map[string]string{}
	var grants lockingv1alpha1.LockGrantList
	if err := c.List(ctx, &grants, client.InNamespace(chaosNamespace)); err != nil {
		return nil, fmt.Errorf("listing the grants after the run: %w", err)
	}
	for i := range grants.Items {
		g := &grants.Items[i]
		e := grantEvent(g)
		e.Op = NoteFinalGrant
		rec.emit(e)
		final["LockGrant/"+g.Name] = g.ResourceVersion
	}
	var cms corev1.ConfigMapList
	if err := c.List(ctx, &cms, client.InNamespace(chaosNamespace), client.MatchingLabels{lockingv1alpha1.GuardedLabel: "true"}); err != nil {
		return nil, fmt.Errorf("listing the guarded objects after the run: %w", err)
	}
	for i := range cms.Items {
		rec.emit(versionEvent(&cms.Items[i], NoteFinalObject))
		final["ConfigMap/"+cms.Items[i].Name] = cms.Items[i].ResourceVersion
	}
	return final, nil
}

// step prints what is starting and returns a function that prints how long
// it took.
func step(what string) func() {
	fmt.Printf("==> %s\n", what)
	start := time.Now()
	return func() { fmt.Printf("    done in %.1fs\n", time.Since(start).Seconds()) }
}
