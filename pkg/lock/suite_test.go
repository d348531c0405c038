package lock_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/issuer"
	lwwebhook "github.com/lockwarden/lockwarden/webhook"
)

// The library's envtest: a real kube-apiserver and etcd from bin/, the
// controller and the webhooks in this process on a fake clock (clk), and
// every holder under its own impersonated identity. A fake clock cannot fire
// the controller's RequeueAfter timer, so a test that needs the controller to
// notice a deadline touches the grant (wake).

var (
	scheme = runtime.NewScheme()
	admin  client.WithWatch
	cfg    *rest.Config
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

// managerNamespace holds the issuer's keys and trust bundle.
const managerNamespace = "lockwarden-system"

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	// The controller's optimistic-concurrency conflicts are logged as
	// errors and retried; keep them out of the test output.
	level := zapcore.DPanicLevel
	if os.Getenv("LOCKWARDEN_TEST_VERBOSE") != "" {
		level = -2
	}
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))

	root, _ := filepath.Abs("../..")
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		os.Setenv("KUBEBUILDER_ASSETS", filepath.Join(root, "bin"))
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "config", "webhook", "manifests.yaml")},
		},
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest (did `make tools` build bin/?): %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	if admin, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	clk = clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := startManager(ctx, env); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := grantUsersAccess(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The Example functions read their configuration the way a program
	// does: from $KUBECONFIG.
	dir, err := os.MkdirTemp("", "lockwarden-lock-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("KUBECONFIG", kc)
	return m.Run()
}

// startManager runs the controller and the webhooks as the manager binary
// does, on the fake clock, and waits until the webhook server answers.
func startManager(ctx context.Context, env *envtest.Environment) error {
	wo := &env.WebhookInstallOptions
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: managerNamespace}}); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:    {Namespaces: map[string]cache.Config{managerNamespace: {}}},
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{managerNamespace: {}}},
		}},
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
	})
	if err != nil {
		return err
	}
	keyring := &issuer.Keyring{Reader: mgr.GetClient(), Namespace: managerNamespace}
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		Clock: clk, Keyring: keyring, Namespace: managerNamespace,
		WebhookConfiguration: "validating-webhook-configuration",
	}); err != nil {
		return err
	}
	if err := lwwebhook.Setup(mgr, clk, keyring.TrustBundle); err != nil {
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

// grantUsersAccess lets every authenticated user work with LockGrants and
// ConfigMaps; admission decides who may do what to a grant.
func grantUsersAccess(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-lock-test-user"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants"}, Verbs: []string{"*"}},
			{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants/status", "fencecounters"}, Verbs: []string{"get", "list", "watch"}},
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

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "lk-"}}
	if err := admin.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

var (
	usersMu sync.Mutex
	users   = map[string]client.WithWatch{}
)

// as returns a direct client that acts as service account NAME of
// namespace billing.
func as(t *testing.T, name string) client.WithWatch {
	t.Helper()
	usersMu.Lock()
	defer usersMu.Unlock()
	user := "system:serviceaccount:billing:" + name
	if c, ok := users[user]; ok {
		return c
	}
	rc := rest.CopyConfig(cfg)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:billing"}}
	c, err := client.NewWithWatch(rc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	users[user] = c
	return c
}

// grantOf reads a grant as admin.
func grantOf(t *testing.T, key types.NamespacedName) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{}
	if err := admin.Get(t.Context(), key, g); err != nil {
		t.Fatal(err)
	}
	return g
}

// wake touches the grant so the controller reconciles its resource, as the
// RequeueAfter timer would once the fake clock passed a deadline.
func wake(t *testing.T, key types.NamespacedName) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"annotations":{"test.lockwarden.io/wake":"%d"}}}`, time.Now().UnixNano())
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := admin.Patch(t.Context(), g, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 5 ms until it holds, failing the test after
// 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("never: %s", what)
	}
}

// waitPhase waits until the grant has phase p and returns it.
func waitPhase(t *testing.T, key types.NamespacedName, p lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{}
	eventually(t, fmt.Sprintf("grant %s is %s", key, p), func() bool {
		return admin.Get(t.Context(), key, g) == nil && g.Status.Phase == p
	})
	return g
}

// closed reports whether ch is closed now.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
