package restore

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
	"github.com/lockwarden/lockwarden/internal/test/pgtest"
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// setupTimeout bounds everything TestMain does before the tests run.
const setupTimeout = 3 * time.Minute

var (
	scheme = runtime.NewScheme()
	// root is the repository root.
	root string
	// cp is the local control plane; admin a cluster-admin client on it.
	cp    *controlPlane
	admin client.WithWatch
	// manager is the lockwarden manager process.
	manager *localcp.Manager
	// workerBin is the examples/settlement binary.
	workerBin string
	// runDir holds kubeconfigs, logs and snapshots of this run.
	runDir string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

// run starts the control plane and the manager, then PostgreSQL (through
// pgtest.Main, which also runs the tests), and stops everything it started,
// in reverse order, whatever happens.
func run(m *testing.M) int {
	if envtest.SkipSuite("it runs a control plane, the manager and PostgreSQL") {
		return 0
	}
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))

	var err error
	if root, err = filepath.Abs("../.."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if runDir, err = os.MkdirTemp("", "lockwarden-restore-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := 1
	defer func() {
		if code == 0 {
			_ = os.RemoveAll(runDir)
		} else {
			fmt.Fprintf(os.Stderr, "Logs of this run (manager, kube-apiserver, etcd) are kept in %s\n", runDir)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	// The binaries build while the control plane starts.
	bins := buildAll(ctx, runDir, "./cmd/manager", "./examples/settlement")

	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	if cp, err = startControlPlane(assets, filepath.Join(root, "config", "crd", "bases"), runDir); err != nil {
		fmt.Fprintf(os.Stderr, "starting the control plane (did `make tools` build bin/?): %v\n", err)
		_ = bins.wait()
		return 1
	}
	defer cp.stop()
	if admin, err = client.NewWithWatch(cp.adminConfig(), client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := bins.wait(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	workerBin = bins.path("./examples/settlement")

	port, err := localcp.FreePort()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := cp.applyLocalConfig(ctx, filepath.Join(root, "config", "local"), port); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	metricsPort, err := localcp.FreePort()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if manager, err = localcp.StartManager(localcp.ManagerOptions{
		Binary: bins.path("./cmd/manager"), Kubeconfig: cp.adminKubeconfig, Dir: runDir, WebhookPort: port,
		MetricsAddr: "127.0.0.1:" + strconv.Itoa(metricsPort),
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer manager.Stop()
	if err := manager.WaitReady(ctx, admin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := grantWorkersAccess(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := installSegmentPolicy(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code = pgtest.Main(m)
	return code
}

// builds compiles main packages of the repository in the background.
type builds struct {
	dir  string
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func buildAll(ctx context.Context, dir string, pkgs ...string) *builds {
	b := &builds{dir: dir}
	for _, pkg := range pkgs {
		b.wg.Go(func() {
			cmd := exec.CommandContext(ctx, "go", "build", "-o", b.path(pkg), pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				b.mu.Lock()
				b.errs = append(b.errs, fmt.Errorf("go build %s: %w\n%s", pkg, err, out))
				b.mu.Unlock()
			}
		})
	}
	return b
}

func (b *builds) path(pkg string) string { return filepath.Join(b.dir, filepath.Base(pkg)) }

func (b *builds) wait() error {
	b.wg.Wait()
	if len(b.errs) > 0 {
		return b.errs[0]
	}
	return nil
}

// grantWorkersAccess lets every authenticated user work with LockGrants and
// ConfigMaps, as a platform team's namespace role would (see
// config/rbac/lockgrant_editor_role.yaml); who may renew, release or write
// under a grant is then admission's decision.
func grantWorkersAccess(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-restore-test-workers"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants/status", "fencecounters"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}
	if err := admin.Create(ctx, role); err != nil {
		return err
	}
	return admin.Create(ctx, binding)
}

// logManagerOnFailure shows the end of the manager's log when t fails.
func logManagerOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of the manager's log %s:\n%s", manager.LogPath, localcp.Tail(manager.LogPath, 40))
		}
	})
}

// oneLine squeezes whitespace, for messages in failures.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
