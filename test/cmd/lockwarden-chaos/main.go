package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Defaults of a run.
const (
	chaosNamespace = "chaos"
	defaultTTL     = 4 * time.Second
)

// options are the driver's flags.
type options struct {
	assets, manager, crds, localConfig string
	// dir is the run directory; empty: a new temporary one.
	dir       string
	duration  time.Duration
	workers   int
	resources int
	ttl       time.Duration
	seed      uint64
	// managerKillEvery is the mean time between manager replica kills.
	managerKillEvery time.Duration
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case workerCommand:
			os.Exit(runWorker(os.Args[2:]))
		case checkCommand:
			os.Exit(runCheck(os.Args[2:]))
		}
	}

	var o options
	flag.StringVar(&o.assets, "assets", "bin", "Directory holding kube-apiserver, etcd and kubectl.")
	flag.StringVar(&o.manager, "manager", "bin/manager", "Path of the lockwarden manager binary.")
	flag.StringVar(&o.crds, "crds", "config/crd/bases", "Directory of the CRD manifests.")
	flag.StringVar(&o.localConfig, "local-config", "config/local", "Kustomization installing the webhook configurations for a local manager.")
	flag.StringVar(&o.dir, "dir", "", "Run directory for logs, kubeconfigs and the history (default: a new temporary directory).")
	flag.DurationVar(&o.duration, "duration", 2*time.Minute, "How long the workload runs under faults.")
	flag.IntVar(&o.workers, "workers", 6, "Worker processes.")
	flag.IntVar(&o.resources, "resources", 3, "Resources the workers contend for (one guarded ConfigMap each).")
	flag.DurationVar(&o.ttl, "ttl", defaultTTL, "Lease duration of the workers' grants (whole seconds).")
	flag.Uint64Var(&o.seed, "seed", 0, "Seed of the fault schedule and the workers' choices (0: from the clock; printed).")
	flag.DurationVar(&o.managerKillEvery, "manager-kill-every", 25*time.Second, "Mean time between kills of a manager replica.")
	flag.Parse()
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	if o.workers < 1 || o.resources < 1 || o.ttl < time.Second || o.ttl%time.Second != 0 {
		fmt.Fprintln(os.Stderr, "lockwarden-chaos: --workers and --resources must be at least 1 and --ttl whole seconds, at least 1s")
		os.Exit(2)
	}
	for _, p := range []*string{&o.assets, &o.manager, &o.crds, &o.localConfig} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "lockwarden-chaos: %v\n", err)
			os.Exit(2)
		}
		*p = abs
	}

	// Not SIGPIPE: with it registered, every write to a connection a
	// killed replica or a fault proxy broke would end the run.
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		// After the first Ctrl-C, a second one kills the run at once.
		<-sigCtx.Done()
		stopSignals()
	}()
	ctx, cancel := context.WithTimeout(sigCtx, o.duration+10*time.Minute)
	rep, err := run(ctx, o)
	cancel()

	switch {
	case err != nil && sigCtx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "\nINTERRUPTED: everything the run started has been stopped.")
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "\nFAIL: %v\n", err)
		os.Exit(1)
	case !rep.Passed():
		fmt.Println("\nFAIL: the checker found violations (above); the history is kept in the run directory.")
		os.Exit(1)
	}
	fmt.Println("\nPASS: every check holds over the recorded history.")
}

// newScheme returns a scheme with the built-in types and lockwarden's.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(lockingv1alpha1.AddToScheme(s))
	return s
}
