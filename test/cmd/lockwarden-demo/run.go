package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// The story's cast and props.
const (
	billingNamespace = "billing"
	storyResource    = "invoice-batch/2026-07-19"
	storyConfigMap   = "invoice-batch-2026-07-19"
	leaseSeconds     = 10
	workDuration     = 3 * time.Second
)

// run sets up the local control plane and the manager, plays the story, and
// stops everything it started before returning, whatever happens.
func run(ctx context.Context, o options) error {
	// Fail before starting anything if the webhook port is taken.
	if err := localcp.CheckPortFree(o.webhookPort); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "lockwarden-demo-")
	if err != nil {
		return err
	}
	fmt.Printf("Logs and kubeconfigs of this run: %s\n", dir)
	demoLog, err := os.Create(filepath.Join(dir, "demo.log"))
	if err != nil {
		return err
	}
	defer demoLog.Close()
	logf.SetLogger(zap.New(zap.WriteTo(demoLog)))

	done := step("Starting a local control plane (etcd + kube-apiserver, envtest)")
	cp, err := localcp.Start(o.assets, o.crds, dir, newScheme())
	if err != nil {
		return err
	}
	defer cp.Stop()
	done()
	admin, err := client.NewWithWatch(cp.AdminConfig, client.Options{Scheme: newScheme()})
	if err != nil {
		return err
	}

	done = step("Installing the webhook configurations (kubectl apply -k config/local)")
	if err := cp.ApplyLocalConfig(ctx, o.localConfig, o.webhookPort); err != nil {
		return err
	}
	done()

	done = step("Starting the manager")
	mgr, err := localcp.StartManager(localcp.ManagerOptions{Binary: o.manager, Kubeconfig: cp.AdminKubeconfig, Dir: dir, WebhookPort: o.webhookPort})
	if err != nil {
		return err
	}
	defer mgr.Stop()
	fmt.Printf("    manager log: %s\n", mgr.LogPath)
	if err := mgr.WaitReady(ctx, admin); err != nil {
		return err
	}
	done()

	if o.serve {
		return serve(ctx, cp.AdminKubeconfig)
	}

	done = step("Creating namespace billing and identities worker-a, worker-b")
	kubeconfigs, err := setupBilling(ctx, cp, admin, dir)
	if err != nil {
		return err
	}
	done()

	fmt.Println("==> Playing the story")
	s := &story{
		admin:       admin,
		self:        mustExecutable(),
		kubeconfigs: kubeconfigs,
		dir:         dir,
		tl:          &timeline{},
	}
	return s.play(ctx)
}

// step prints what is starting and returns a function that prints how long
// it took.
func step(what string) func() {
	fmt.Printf("==> %s\n", what)
	start := time.Now()
	return func() { fmt.Printf("    done in %.1fs\n", time.Since(start).Seconds()) }
}

func mustExecutable() string {
	p, err := os.Executable()
	if err != nil {
		panic(fmt.Sprintf("finding the demo's own binary: %v", err))
	}
	return p
}

// serve keeps the control plane and the manager running for a hands-on
// session (make playground) until the user presses Ctrl-C.
func serve(ctx context.Context, kubeconfig string) error {
	fmt.Printf("\nA local control plane with lockwarden is running. In another terminal:\n\n")
	fmt.Printf("    export KUBECONFIG=%s\n\n", kubeconfig)
	fmt.Printf("Press Ctrl-C to stop everything.\n")
	<-ctx.Done()
	return ctx.Err()
}
