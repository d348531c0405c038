package cluster

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

var (
	clusterDir    = flag.String("cluster-dir", "", "State directory of the cluster `make cluster` started (its kubeconfig and env); empty skips the suite.")
	repoRoot      = flag.String("root", "../..", "Repository root: the chart, config/ and bin/.")
	image         = flag.String("image", "", "The manager image under test, as loaded into the cluster (make test-cluster passes IMG).")
	previousImage = flag.String("previous-image", "", "The previous release's image, loaded into the cluster, for the upgrade test (make test-cluster builds it).")
	previousChart = flag.String("previous-chart", "", "The previous release's Helm chart, for the upgrade test (make test-cluster writes it).")
	// previousMissing says why the previous release could not be built:
	// its commit is not in the clone (a shallow CI clone whose fetch of
	// it failed). The upgrade test is then skipped with that reason, and
	// the rest of the suite runs.
	previousMissing = flag.String("previous-missing", "", "Why the previous release's image could not be built (its PREVIOUS_REF is not in the clone); the upgrade test is then skipped with this reason (make test-cluster sets it).")
	installs        = flag.Int("installs", 5, "How many times each install path is played from scratch.")
)

// The release every test installs, as the README does.
const (
	release          = "lockwarden"
	releaseNamespace = "lockwarden-system"
	deployment       = "lockwarden-controller-manager"
	webhookService   = "lockwarden-webhook-service"
	webhookSecret    = "lockwarden-webhook-server-cert"
)

// env is the cluster under test.
var env struct {
	root, dir, kubeconfig string
	// vars are the cluster's facts from CLUSTER_DIR/env: NETNS,
	// CGROUP_ROOT, CONTAINERD_ADDRESS, NODE.
	vars   map[string]string
	cfg    *rest.Config
	c      client.WithWatch
	cs     kubernetes.Interface
	scheme *runtime.Scheme
	start  time.Time
}

func TestMain(m *testing.M) {
	flag.Parse()
	if *clusterDir == "" {
		fmt.Println("cluster: no -cluster-dir: the real-node suite runs with `make cluster test-cluster` (root, Linux)")
		os.Exit(0)
	}
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
	code := m.Run()
	report()
	os.Exit(code)
}

func setup() error {
	logf.SetLogger(logr.Discard()) // pkg/lock's logs; the suite reports what it checks
	var err error
	if env.root, err = filepath.Abs(*repoRoot); err != nil {
		return err
	}
	if env.dir, err = filepath.Abs(*clusterDir); err != nil {
		return err
	}
	env.kubeconfig = filepath.Join(env.dir, "kubeconfig")
	if *image == "" {
		return fmt.Errorf("-image is required")
	}
	env.vars = map[string]string{}
	b, err := os.ReadFile(filepath.Join(env.dir, "env"))
	if err != nil {
		return fmt.Errorf("no cluster in %s (make cluster): %w", env.dir, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env.vars[k] = v
		}
	}
	if env.cfg, err = clientcmd.BuildConfigFromFlags("", env.kubeconfig); err != nil {
		return err
	}
	env.cfg.QPS, env.cfg.Burst = 200, 400
	env.scheme = runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(env.scheme); err != nil {
		return err
	}
	if err := lockingv1alpha1.AddToScheme(env.scheme); err != nil {
		return err
	}
	if env.c, err = client.NewWithWatch(env.cfg, client.Options{Scheme: env.scheme}); err != nil {
		return err
	}
	if env.cs, err = kubernetes.NewForConfig(env.cfg); err != nil {
		return err
	}
	env.start = time.Now()
	return nil
}

// kubectl runs bin/kubectl against the cluster and returns its output; a
// failure is an error carrying the output.
func kubectl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, filepath.Join(env.root, "bin", "kubectl"), args...)
}

// helm runs bin/helm against the cluster from the repository root.
func helm(ctx context.Context, args ...string) (string, error) {
	return run(ctx, filepath.Join(env.root, "bin", "helm"), args...)
}

func run(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = env.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// must returns a function that fails the test on a command's error and
// returns its output otherwise: must(t)(kubectl(ctx, ...)).
func must(t *testing.T) func(string, error) string {
	t.Helper()
	return func(out string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// eventually polls cond every 200 ms until it holds or timeout passes, and
// fails the test with what and cond's last error then.
func eventually(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if ctx.Err() == nil {
			last = err
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting %s until %s: %v (last: %v)", timeout, what, err, last)
	}
}

// timing is one figure the suite reports at the end, against its target
// (0: none).
type timing struct {
	what   string
	took   time.Duration
	target time.Duration
}

var (
	timingsMu sync.Mutex
	timings   []timing
)

// record notes a timing, and logs it for the test.
func record(t *testing.T, what string, took, target time.Duration) {
	t.Helper()
	timingsMu.Lock()
	timings = append(timings, timing{what, took, target})
	timingsMu.Unlock()
	t.Logf("%s: %.1fs", what, took.Seconds())
	if target > 0 && took > target {
		t.Errorf("%s took %.1fs, over the %.0fs target", what, took.Seconds(), target.Seconds())
	}
}

// skips are the steps the suite skipped, with why, for the report.
var skips []string

// skipped skips step t and notes it for the report: a step the suite
// could not run says so in its summary, not only in the test's log.
func skipped(t *testing.T, step, why string) {
	t.Helper()
	timingsMu.Lock()
	skips = append(skips, fmt.Sprintf("%s SKIPPED: %s", step, why))
	timingsMu.Unlock()
	t.Skipf("SKIPPED: %s", why)
}

// report prints every timing, grouped by what was measured, the steps
// skipped and why, and the suite's wall time.
func report() {
	groups := map[string][]time.Duration{}
	targets := map[string]time.Duration{}
	var order []string
	for _, tm := range timings {
		if _, ok := groups[tm.what]; !ok {
			order = append(order, tm.what)
		}
		groups[tm.what] = append(groups[tm.what], tm.took)
		targets[tm.what] = tm.target
	}
	fmt.Println("\nreal-node suite timings:")
	for _, what := range order {
		d := groups[what]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		line := fmt.Sprintf("  %-46s n=%d min %.1fs max %.1fs", what, len(d), d[0].Seconds(), d[len(d)-1].Seconds())
		if tg := targets[what]; tg > 0 {
			line += fmt.Sprintf(" (target < %.0fs)", tg.Seconds())
		}
		fmt.Println(line)
	}
	for _, s := range skips {
		fmt.Println("  " + s)
	}
	fmt.Printf("  %-46s %.1fs (target < 360s)\n", "suite wall time", time.Since(env.start).Seconds())
}
