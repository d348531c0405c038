package lock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// The library's envtest: a real kube-apiserver and etcd from bin/, the
// controller and the webhooks in this process on a fake clock (clk), and
// every holder under its own impersonated identity. A fake clock cannot fire
// the controller's RequeueAfter timer, so a test that needs the controller to
// notice a deadline touches the grant (wake).

var (
	env    *envtest.Env
	scheme *runtime.Scheme
	admin  client.WithWatch
	cfg    *rest.Config
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

func TestMain(m *testing.M) {
	clk = clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	envtest.Main(m, envtest.Suite{
		Clock: clk,
		Setup: func(ctx context.Context, e *envtest.Env) error {
			env, scheme, admin, cfg = e, e.Scheme, e.Admin, e.Config
			if err := e.GrantUsersAccess(ctx); err != nil {
				return err
			}
			// The Example functions read their configuration the way a
			// program does: from $KUBECONFIG.
			dir, err := os.MkdirTemp("", "lockwarden-lock-test-")
			if err != nil {
				return err
			}
			e.Cleanup(func() { os.RemoveAll(dir) })
			kc := filepath.Join(dir, "kubeconfig")
			if err := os.WriteFile(kc, e.Env.KubeConfig, 0o600); err != nil {
				return err
			}
			return os.Setenv("KUBECONFIG", kc)
		},
		// With the control plane stopped, no goroutine of the library may
		// be left: every handle's loop, watch and request ends with it.
		FindLeaks: true,
	})
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

// newTestClient is lock.NewClient whose session is closed when the test
// ends, as a program closes its Client before it exits.
func newTestClient(t *testing.T, c client.WithWatch, opts ...lock.Option) *lock.Client {
	t.Helper()
	l := lock.NewClient(c, opts...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// checkErr is Handle.Check's verdict alone.
func checkErr(h *lock.Handle) error {
	_, err := h.Check()
	return err
}

// remaining is the time Handle.Check leaves the holder (0 when it fails).
func remaining(h *lock.Handle) time.Duration {
	left, _ := h.Check()
	return left
}
