// Package envtest starts what lockwarden's envtest suites run against: a
// real kube-apiserver and etcd from bin/ (controller-runtime's envtest),
// lockwarden's CRDs and webhook configuration, and the manager's
// controllers and webhooks running in the test process exactly as
// cmd/manager wires them, on the clock the suite chooses (a fake clock
// steps lease timing instead of waiting).
//
// A suite owns one environment for all its tests and hands its TestMain to
// Main, which starts the environment, runs the suite's Setup and its
// tests, stops everything and exits:
//
//	var env *envtest.Env
//
//	func TestMain(m *testing.M) {
//		envtest.Main(m, envtest.Suite{
//			Clock: clk,
//			Setup: func(ctx context.Context, e *envtest.Env) error {
//				env = e
//				return e.GrantUsersAccess(ctx)
//			},
//		})
//	}
//
// A test that needs a control plane of its own, with no manager (it runs
// the manager or its controllers itself), calls StartControlPlane.
//
// Under go test -short (make test-unit) nothing here starts a control plane:
// Main skips the whole suite, and StartControlPlane, Repo and Build skip the
// test, each saying so. make test-envtest and make test run them.
package envtest

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/recovery"
	lwwebhook "github.com/lockwarden/lockwarden/webhook"
	"github.com/lockwarden/lockwarden/webhook/guard"
)

// ManagerNamespace holds the issuer's keys and trust bundle.
const ManagerNamespace = "lockwarden-system"

// Env is one running test environment.
type Env struct {
	// Root is the repository root.
	Root string
	// Env is envtest's environment (KubeConfig, AddUser, the etcd URL).
	Env *crenvtest.Environment
	// Config is the admin's REST config; Admin its client.
	Config *rest.Config
	Admin  client.WithWatch
	Scheme *runtime.Scheme
	// Cache reads what the in-process manager's informers show: a test
	// waits on it for the manager to have seen a change, before it moves
	// the manager's clock on.
	Cache client.Reader
	// Floors is the manager's fence floor scan; it scans once at start,
	// and a test that needs a later scan runs Floors.Scan itself.
	Floors *recovery.Scanner
	cancel context.CancelFunc
	// cleanups run, last registered first, when the environment stops.
	cleanups []func()
}

// Options are the manager's settings that a suite may choose; the zero
// value keeps finished grants forever.
type Options struct {
	// FinishedGrantRetention and RequestIDWindow are the manager's
	// --finished-grant-retention and --request-id-window.
	FinishedGrantRetention, RequestIDWindow time.Duration
	// GuardReads is the manager's --guard-reads; "" is its default,
	// guard.ReadsCached.
	GuardReads guard.Reads
}

// Suite is what a suite asks of Main: the manager's clock and settings, or
// a control plane alone, and what to do once it runs.
type Suite struct {
	// Clock is the in-process manager's clock; nil is the real clock.
	Clock clock.PassiveClock
	// Options are the manager's settings.
	Options Options
	// ControlPlaneOnly starts the API server and etcd with lockwarden's
	// CRDs only: no manager, no webhook configuration, no admission
	// policies (a suite that judges one of them alone installs it in
	// Setup).
	ControlPlaneOnly bool
	// Setup runs once the environment is up, before the tests; a suite
	// keeps e (and its clients) for its tests here. What it starts, it
	// stops with e.Cleanup. An error fails the suite before any test runs.
	Setup func(ctx context.Context, e *Env) error
	// FindLeaks fails a passing suite when goroutines other than the
	// long-lived ones of client-go and controller-runtime are left once the
	// environment has stopped (see FindLeaks): nothing the code under test
	// started may outlive it.
	FindLeaks bool
}

// Main owns a suite's TestMain: it runs the suite (Run) and exits with its
// code.
func Main(m *testing.M, s Suite) {
	os.Exit(Run(m, s))
}

// Run starts the suite's environment from the repository's bin/ (unless
// KUBEBUILDER_ASSETS says otherwise), runs s.Setup and then m's tests,
// stops the environment whatever happened, and returns the exit code for
// TestMain. Errors of the set-up go to stderr and fail the suite. Under
// -short it runs nothing and says so (SkipSuite).
func Run(m *testing.M, s Suite) int {
	if SkipSuite("it runs on a control plane") {
		return 0
	}
	root, err := Root()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var e *Env
	if s.ControlPlaneOnly {
		e, err = startControlPlane(root, false)
	} else {
		clk := s.Clock
		if clk == nil {
			clk = clock.RealClock{}
		}
		e, err = start(root, clk, s.Options)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := func() int {
		defer e.Stop()
		if s.Setup != nil {
			if err := s.Setup(context.Background(), e); err != nil {
				fmt.Fprintf(os.Stderr, "setting up the suite: %v\n", err)
				return 1
			}
		}
		return m.Run()
	}()
	if code == 0 && s.FindLeaks {
		if err := FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// StartControlPlane starts an API server and etcd with lockwarden's CRDs,
// and nothing else (no manager, no namespace of its own, no webhook
// configuration, no admission policies), for test t alone: a test that
// runs the manager, its replicas or a controller itself. They stop when t
// ends. Its Admin client is an administrator's.
func StartControlPlane(t testing.TB) *Env {
	t.Helper()
	SkipShort(t, "it starts a control plane")
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	e, err := startControlPlane(root, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// SkipShort skips t under -short (make test-unit), why being what it needs
// ("it starts a control plane").
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: %s; make test-envtest, make test-e2e and make test run it", why)
	}
}

// SkipSuite is for a TestMain: under -short it prints that the package's
// tests are skipped, and why ("it runs on a control plane"), and returns
// true; TestMain then returns 0 without running them.
func SkipSuite(why string) bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	if !testing.Short() {
		return false
	}
	fmt.Fprintf(os.Stderr, "-short: skipping every test of this package: %s; make test-envtest, make test-e2e and make test run them\n", why)
	return true
}

// Root is the repository's root: the nearest directory, from the working
// directory (a test's package directory) up, whose go.mod is lockwarden's
// module (the test module's go.mod, in test/, is passed by).
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isRoot(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of module github.com/lockwarden/lockwarden above the working directory")
		}
		dir = parent
	}
}

func isRoot(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return fields[1] == "github.com/lockwarden/lockwarden"
		}
	}
	return false
}

// start starts the control plane and the in-process manager on clk, with
// the manager's settings o. root is the repository root (bin/ holds the
// control plane, unless KUBEBUILDER_ASSETS says otherwise). Log output goes
// to stderr at the error level, or at debug level when
// LOCKWARDEN_TEST_VERBOSE is set. On error nothing is left running.
func start(root string, clk clock.PassiveClock, o Options) (*Env, error) {
	level := zapcore.DPanicLevel
	if os.Getenv("LOCKWARDEN_TEST_VERBOSE") != "" {
		level = zapcore.DebugLevel
	}
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))
	e, err := startControlPlane(root, true)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	if err := e.installPolicies(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.startManager(ctx, clk, o); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.awaitPolicies(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

// startControlPlane starts etcd and the API server with lockwarden's CRDs
// (and, with webhooks, the webhook configuration of config/webhook, which
// calls this process), and an admin client. On error nothing is left
// running.
func startControlPlane(root string, webhooks bool) (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		os.Setenv("KUBEBUILDER_ASSETS", filepath.Join(root, "bin"))
	}
	e := &Env{Root: root, Scheme: runtime.NewScheme()}
	utilruntime.Must(clientgoscheme.AddToScheme(e.Scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(e.Scheme))
	e.Env = &crenvtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	if webhooks {
		e.Env.WebhookInstallOptions = crenvtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "config", "webhook", "manifests.yaml")},
		}
	}
	var err error
	if e.Config, err = e.Env.Start(); err != nil {
		_ = e.Env.Stop() // a half-started control plane must not outlive the test
		return nil, fmt.Errorf("starting envtest (did `make tools` build bin/?): %w", err)
	}
	if e.Admin, err = client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme}); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

// Cleanup registers f to run when the environment stops, before the
// manager and the control plane stop; the last registered runs first.
func (e *Env) Cleanup(f func()) {
	e.cleanups = append(e.cleanups, f)
}

// Stop runs the cleanups, then stops the manager and the control plane.
func (e *Env) Stop() {
	for _, f := range slices.Backward(e.cleanups) {
		f()
	}
	e.cleanups = nil
	if e.cancel != nil {
		e.cancel()
	}
	if err := e.Env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
	}
}

// PolicyFiles are the manifests of config/policy that the test control
// plane installs: the admission policies the API server judges in
// process, and their bindings.
var PolicyFiles = []string{"lockgrant_updates.yaml"}

// installPolicies creates the admission policies and bindings of
// config/policy, as config/default installs them (without its name
// prefix); awaitPolicies waits until the API server enforces them.
func (e *Env) installPolicies(ctx context.Context) error {
	for _, f := range PolicyFiles {
		path := filepath.Join(e.Root, "config", "policy", f)
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, part := range strings.Split(string(raw), "\n---") {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(part), &u.Object); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if err := e.Admin.Create(ctx, u); err != nil {
				return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
	}
	return nil
}

// awaitPolicies waits until the API server enforces the LockGrant update
// policy (it loads policies in the background): the owner's dry-run renew
// of a request it withdrew at birth is refused ALREADY_ENDED, which only
// the policy judges (the webhook leaves the owner's own renew to it). The
// probe request is never granted and is deleted afterwards.
func (e *Env) awaitPolicies(ctx context.Context) error {
	rc := rest.CopyConfig(e.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "lockwarden-policy-probe", Groups: []string{"system:masters", "system:authenticated"}}
	c, err := client.New(rc, client.Options{Scheme: e.Scheme})
	if err != nil {
		return err
	}
	probe := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "lockwarden-policy-probe-"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: "lockwarden-policy-probe", LeaseDurationSeconds: 1, Release: true},
	}
	if err := c.Create(ctx, probe); err != nil {
		return fmt.Errorf("creating the policy probe: %w", err)
	}
	defer func() { _ = c.Delete(context.WithoutCancel(ctx), probe) }()
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"renewals":1}}`))
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return apierrors.IsForbidden(c.Patch(ctx, probe.DeepCopy(), patch, client.DryRunAll)), nil
	})
	if err != nil {
		return fmt.Errorf("the admission policies of config/policy never took effect: %w", err)
	}
	return nil
}

// startManager runs the controllers and the webhooks as cmd/manager does,
// and waits until the webhook server answers.
func (e *Env) startManager(ctx context.Context, clk clock.PassiveClock, o Options) error {
	wo := &e.Env.WebhookInstallOptions
	if err := e.Admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme: e.Scheme,
		Cache: cache.Options{
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Secret{}:    {Namespaces: map[string]cache.Config{ManagerNamespace: {}}},
				&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{ManagerNamespace: {}}},
				// Leases: only client sessions (spec.session of LockGrants).
				&coordinationv1.Lease{}: {Label: labels.SelectorFromSet(labels.Set{lockingv1alpha1.SessionLabel: "true"})},
			},
			// No reader of the cache uses managedFields (every write
			// sends none, which keeps the stored ones): they are most of a
			// small object's bytes, decoded and kept for every version.
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
	})
	if err != nil {
		return err
	}
	e.Cache = mgr.GetCache()
	keyring := &issuer.Keyring{Reader: mgr.GetClient(), Namespace: ManagerNamespace}
	if e.Floors, err = recovery.New(mgr.GetConfig(), mgr.GetAPIReader(), 0, mgr.GetLogger().WithName("fence-floors")); err != nil {
		return err
	}
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		Floors: e.Floors,
		Clock:  clk, Keyring: keyring, Namespace: ManagerNamespace,
		FinishedGrantRetention: o.FinishedGrantRetention, RequestIDWindow: o.RequestIDWindow,
		WebhookConfiguration: "validating-webhook-configuration",
	}); err != nil {
		return err
	}
	if err := lwwebhook.Setup(mgr, clk, keyring.TrustBundle, o.RequestIDWindow, cmp.Or(o.GuardReads, guard.ReadsCached)); err != nil {
		return err
	}
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "manager stopped: %v\n", err)
		}
	}()
	addr := net.JoinHostPort(wo.LocalServingHost, fmt.Sprint(wo.LocalServingPort))
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // probing readiness only
		if err != nil {
			return false, nil
		}
		return true, conn.Close()
	})
}

// GrantUsersAccess lets every authenticated user work with LockGrants and
// ConfigMaps, as a platform team's role would; who may do what to a grant
// or a guarded object is then admission's decision. The force-release verb
// is deliberately not granted.
func (e *Env) GrantUsersAccess(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-test-user"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants/status", "fencecounters"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}
	if err := e.Admin.Create(ctx, role); err != nil {
		return err
	}
	return e.Admin.Create(ctx, binding)
}

// Namespace creates a fresh namespace named prefix-xxxxx.
func (e *Env) Namespace(ctx context.Context, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Admin.Create(ctx, ns); err != nil {
		return "", err
	}
	return ns.Name, nil
}

// GrantUsersSessions lets every authenticated user keep client sessions
// (coordination.k8s.io Leases, see pkg/lock.Session) in namespace ns, or in
// every namespace when ns is "". Without it, pkg/lock makes requests
// without a session.
func (e *Env) GrantUsersSessions(ctx context.Context, ns string) error {
	rules := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}
	subjects := []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}
	name := "lockwarden-test-sessions"
	if ns == "" {
		if err := e.Admin.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}); err != nil {
			return err
		}
		return e.Admin.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   subjects,
		})
	}
	if err := e.Admin.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}); err != nil {
		return err
	}
	return e.Admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subjects,
	})
}
