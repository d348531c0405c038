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
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// options are the demo's flags.
type options struct {
	// assets is the directory holding kube-apiserver, etcd and kubectl.
	assets string
	// manager is the path of the manager binary.
	manager string
	// crds is the directory of the CRD manifests envtest installs.
	crds string
	// localConfig is the kustomization applied with kubectl.
	localConfig string
	// timeout bounds the whole run, set-up and clean-up excluded.
	timeout time.Duration
	// serve keeps the control plane and manager up instead of playing the
	// story (make playground).
	serve bool
	// webhookPort is the manager's webhook port on localhost.
	webhookPort int
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == workerCommand {
		os.Exit(runWorker(os.Args[2:]))
	}

	var o options
	flag.StringVar(&o.assets, "assets", "bin", "Directory holding kube-apiserver, etcd and kubectl.")
	flag.StringVar(&o.manager, "manager", "bin/manager", "Path of the lockwarden manager binary.")
	flag.StringVar(&o.crds, "crds", "config/crd/bases", "Directory of the CRD manifests.")
	flag.StringVar(&o.localConfig, "local-config", "config/local", "Kustomization installing the webhook configurations for a local manager.")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "Deadline of the whole demo.")
	flag.IntVar(&o.webhookPort, "webhook-port", localcp.DefaultWebhookPort, "Port of the manager's webhook server on localhost (the API server is pointed at it).")
	flag.BoolVar(&o.serve, "serve", false, "Start the control plane and the manager, print a KUBECONFIG to use, and keep them running until Ctrl-C instead of playing the story.")
	flag.Parse()
	if o.serve {
		o.timeout = 24 * time.Hour
	}

	for _, p := range []*string{&o.assets, &o.manager, &o.crds, &o.localConfig} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "lockwarden-demo: %v\n", err)
			os.Exit(2)
		}
		*p = abs
	}

	// SIGPIPE too: if whoever reads our output goes away, still clean up.
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		// After the first Ctrl-C, a second one kills the demo at once.
		<-sigCtx.Done()
		stopSignals()
	}()
	ctx, cancel := context.WithTimeout(sigCtx, o.timeout)
	err := run(ctx, o)
	cancel()

	switch {
	case err == nil:
		fmt.Println("\nPASS: A's late write was refused with STALE_OWNER; the ConfigMap holds B's result.")
	case sigCtx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "\nINTERRUPTED: everything the demo started has been stopped.")
		if o.serve {
			return
		}
		os.Exit(130)
	default:
		fmt.Fprintf(os.Stderr, "\nFAIL: %v\n", err)
		os.Exit(1)
	}
}

// newScheme returns a scheme with the built-in types and lockwarden's.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(lockingv1alpha1.AddToScheme(s))
	return s
}
