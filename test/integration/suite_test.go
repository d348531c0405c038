package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

	"go.uber.org/zap/zapcore"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/issuer"
	lwwebhook "github.com/lockwarden/lockwarden/webhook"
)

var (
	scheme = runtime.NewScheme()
	// admin is a client with cluster-admin rights.
	admin client.Client
	// cfg is the admin rest config; users impersonate from it.
	cfg *rest.Config
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

// managerNamespace holds the issuer's keys and trust bundle.
const managerNamespace = "lockwarden-system"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.Level(zapLevel()))))

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
		_ = env.Stop() // a half-started control plane must not outlive the test
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	if admin, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
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
	return m.Run()
}

func zapLevel() int8 {
	if os.Getenv("LOCKWARDEN_TEST_VERBOSE") != "" {
		return -1
	}
	return 2 // errors only
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
// ConfigMaps, as a platform team's namespace role would; who may do what to
// a grant or a guarded object is then admission's decision.
func grantUsersAccess(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-test-user"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants/status", "fencecounters"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-test-user"},
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
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "lw-"}}
	if err := admin.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
