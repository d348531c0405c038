package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// defaultRetention is the manager's own default --finished-grant-retention,
// used for every phase but scale.
const defaultRetention = time.Hour

// run sets up the local control plane and the manager, runs every phase,
// reports, and stops everything it started before returning, whatever
// happens. What was measured before a failure is still reported.
func run(ctx context.Context, o options) (err error) {
	started := time.Now().UTC()
	dir := filepath.Join(o.out, started.Format("20060102T150405Z"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Printf("Results, logs and kubeconfigs of this run: %s\n", dir)
	logFile, err := os.Create(filepath.Join(dir, "bench.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	logger := zap.New(zap.WriteTo(logFile))
	logf.SetLogger(logger)
	klog.SetLogger(logger) // client-go's leader election logs through klog

	b := &bench{o: o, dir: dir, res: newResults()}
	desc := machine()
	defer func() {
		if len(b.res.rows) == 0 && len(b.res.permits) == 0 {
			return
		}
		incomplete := ""
		if err != nil {
			incomplete = err.Error()
		}
		if werr := b.report(desc, started, incomplete); werr != nil && err == nil {
			err = werr
		}
	}()

	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	webhookPort := ports[0]

	done := step("Starting a local control plane (etcd + kube-apiserver, envtest)")
	cp, err := startControlPlane(o, dir)
	if err != nil {
		return err
	}
	defer cp.stop()
	b.cp = cp
	done()
	if b.admin, err = cp.newClient(); err != nil {
		return err
	}
	b.cpu = newCPUMeter(cp)

	done = step(fmt.Sprintf("Installing config/local with the webhooks on localhost:%d", webhookPort))
	if err := cp.installLocalConfig(ctx, o.localConfig, webhookPort); err != nil {
		return err
	}
	done()

	done = step("Starting the manager")
	defer func() {
		if b.mgr != nil {
			b.mgr.stop()
		}
	}()
	restarts := 0
	b.managerRestart = func(ctx context.Context, retention time.Duration, replicas int) error {
		if b.mgr != nil {
			b.mgr.stop()
			b.mgr = nil
		}
		log := filepath.Join(dir, "manager.log")
		if restarts > 0 {
			log = filepath.Join(dir, fmt.Sprintf("manager-%d.log", restarts))
		}
		restarts++
		m, err := startManager(o.manager, cp.adminKubeconfig, log, webhookPort, retention, replicas)
		if err != nil {
			return err
		}
		b.mgr, b.replicas = m, replicas
		return m.waitReady(ctx, b.admin)
	}
	if err := b.managerRestart(ctx, defaultRetention, o.replicas[0]); err != nil {
		return err
	}
	done()
	for _, ns := range benchNamespaces {
		if err := b.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}

	phases := []struct {
		key, name string
		fn        func(context.Context) error
	}{
		{"floors", "Raw floors: etcd Put, API-server Update", b.floors},
		{"handoff", "Handoff latency", b.handoff},
		{"traced", "Handoff path breakdown (lockwarden, traced)", b.traced},
		{"expiry", "Expiry handoff", b.expiry},
		{"throughput", "Cycle throughput", b.throughput},
		{"permits", fmt.Sprintf("Counted permits: cycle throughput on one resource with %v permits", permitCounts), b.permits},
		{"admission", "Admission overhead", b.admission},
		{"deadwaiters", "Handoff past waiters that died in the queue", b.deadWaiters},
		{"failover", "Leader failover: fenced election beside client-go leader election", b.failover},
		{"longqueue", fmt.Sprintf("Long queue: %d requests on one resource", o.longQueue), b.longQueue},
		{"scale", fmt.Sprintf("Scale: %d live grants", o.scale), b.scale},
	}
	for _, p := range phases {
		if !o.runs(p.key) {
			continue
		}
		done := step(p.name)
		if err := p.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		done()
	}
	return nil
}

// report prints the table and writes the run's folder.
func (b *bench) report(desc string, started time.Time, incomplete string) error {
	var md bytes.Buffer
	b.res.writeMarkdown(&md, b.o, desc, started.Format("2006-01-02 15:04 UTC"), incomplete)
	fmt.Println()
	os.Stdout.Write(md.Bytes())
	if err := os.WriteFile(filepath.Join(b.dir, "results.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	if err := b.res.writeCSV(filepath.Join(b.dir, "samples.csv")); err != nil {
		return err
	}
	if len(b.res.handoff) > 0 {
		if err := plotCDF(filepath.Join(b.dir, "handoff.png"), "Handoff latency: release call → waiter observes itself holding", b.res.handoff, true); err != nil {
			return fmt.Errorf("plotting: %w", err)
		}
	}
	if len(b.res.expiry) > 0 {
		if err := plotCDF(filepath.Join(b.dir, "expiry.png"), "Expiry handoff: holder's expiresAt → successor observes itself holding", b.res.expiry, false); err != nil {
			return fmt.Errorf("plotting: %w", err)
		}
	}
	fmt.Printf("\nWritten: %s (results.md, samples.csv, handoff.png, expiry.png, logs)\n", b.dir)
	return nil
}

// step prints what is starting and returns a function that prints how long
// it took.
func step(what string) func() {
	fmt.Printf("==> %s\n", what)
	start := time.Now()
	return func() { fmt.Printf("    done in %.1fs\n", time.Since(start).Seconds()) }
}
