package election_test

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// The elector's envtest: a real kube-apiserver and etcd from bin/, the
// lockwarden controller and webhooks in this process on the real clock
// (terms expire as they would in a cluster: the tests use leases of a few
// seconds), and every candidate under an impersonated identity.

var env *envtest.Env

func TestMain(m *testing.M) {
	envtest.Main(m, envtest.Suite{
		Setup: func(ctx context.Context, e *envtest.Env) error {
			env = e
			return e.GrantUsersAccess(ctx)
		},
		// With the control plane stopped, no goroutine of an elector may
		// be left: its terms, watches and requests end with Run.
		FindLeaks: true,
	})
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "el-"}}
	if err := env.Admin.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

var (
	usersMu sync.Mutex
	users   = map[string]client.WithWatch{}
)

// as returns a direct client that acts as service account NAME of
// namespace ops.
func as(t *testing.T, name string) client.WithWatch {
	t.Helper()
	usersMu.Lock()
	defer usersMu.Unlock()
	user := "system:serviceaccount:ops:" + name
	if c, ok := users[user]; ok {
		return c
	}
	rc := rest.CopyConfig(env.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ops"}}
	c, err := client.NewWithWatch(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	users[user] = c
	return c
}

// eventually polls cond every 10 ms until it holds, failing the test after
// 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("never: %s", what)
	}
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
