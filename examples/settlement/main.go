package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// config is the worker's flags.
type config struct {
	kubeconfig  string
	cluster     string
	namespace   string
	adoptLegacy bool
	dsn         string
	batch       string
	invoices    int
	segmentSize int
	ttlSeconds  int
	timeout     time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "Kubeconfig of the worker's identity; empty: $KUBECONFIG, ~/.kube/config or in-cluster.")
	flag.StringVar(&c.cluster, "cluster", os.Getenv("LOCKWARDEN_CLUSTER"), "Name of the lockwarden installation that issues the fences (default $LOCKWARDEN_CLUSTER): the same for every worker of it, different for installations sharing the database, and never changed once records exist.")
	flag.StringVar(&c.namespace, "namespace", "default", "Namespace of the LockGrant; its fences and the store's records are per namespace.")
	flag.BoolVar(&c.adoptLegacy, "adopt-legacy-records", false, "Records in the database written before the store keyed them by cluster and namespace belong to --cluster and --namespace: assign them there while migrating.")
	flag.StringVar(&c.dsn, "dsn", os.Getenv("DATABASE_URL"), "PostgreSQL URL, e.g. postgres://user@host:5432/db?sslmode=disable (default $DATABASE_URL).")
	flag.StringVar(&c.batch, "batch", time.Now().UTC().Format("2006-01-02"), "The invoice batch to settle; the locked resource is invoice-batch/BATCH.")
	flag.IntVar(&c.invoices, "invoices", 12, "Number of invoices in the batch.")
	flag.IntVar(&c.segmentSize, "segment-size", 4, "Invoices per segment.")
	flag.IntVar(&c.ttlSeconds, "ttl", 60, "Lease duration, in seconds (1 to 3600).")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "Give up after this long.")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := c.run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "settlement:", err)
		os.Exit(1)
	}
}

// run settles the batch with a kube client built from the flags.
func (c config) run(ctx context.Context, out io.Writer) error {
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.kubeconfig, Precedence: clientcmd.NewDefaultClientConfigLoadingRules().Precedence},
		&clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if rc, err = rest.InClusterConfig(); err != nil {
			return fmt.Errorf("no kubeconfig: %w", err)
		}
	}
	return c.runWith(ctx, rc, out)
}

// runWith settles the batch against the API server of rc.
func (c config) runWith(ctx context.Context, rc *rest.Config, out io.Writer) error {
	if c.dsn == "" {
		return errors.New("--dsn (or $DATABASE_URL) is required")
	}
	if c.cluster == "" {
		return errors.New("--cluster (or $LOCKWARDEN_CLUSTER) is required: the store keeps fences per cluster")
	}
	b, err := newBatch(c.batch, c.invoices, c.segmentSize)
	if err != nil {
		return err
	}
	kube, err := client.NewWithWatch(rc, client.Options{Scheme: scheme()})
	if err != nil {
		return err
	}
	db, err := postgres.Open(c.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrate(ctx, db, postgres.Scope{Cluster: c.cluster, Namespace: c.namespace}, c.adoptLegacy); err != nil {
		return err
	}

	g, err := acquire(ctx, kube, c.namespace, b.resource, b.root, int32(c.ttlSeconds))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "held %s/%s on %s: fence %d, owner %s\n", g.Namespace, g.Name, b.resource, g.Status.FenceToken, g.Spec.Owner)
	store := postgres.New(db, grantRegistry{reader: kube, grant: client.ObjectKeyFromObject(g)},
		postgres.WithCluster(c.cluster), postgres.WithRegressionHook(reportRegression(kube, g, out)))
	settleErr := settle(ctx, store, holderOf(g), b, out)
	// Release even when settling stopped: a refused worker must not keep
	// the lease until it expires.
	if err := release(ctx, kube, g); err != nil {
		return errors.Join(settleErr, err)
	}
	fmt.Fprintf(out, "released %s/%s\n", g.Namespace, g.Name)
	return settleErr
}

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(lockingv1alpha1.AddToScheme(s))
	return s
}
