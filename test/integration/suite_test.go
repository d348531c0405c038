package integration

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

var (
	env *envtest.Env
	// admin is a client with cluster-admin rights.
	admin client.Client
	// cfg is the admin rest config; users impersonate from it.
	cfg *rest.Config
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

// managerNamespace holds the issuer's keys and trust bundle.
const managerNamespace = envtest.ManagerNamespace

func TestMain(m *testing.M) {
	clk = clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	envtest.Main(m, envtest.Suite{
		Clock: clk,
		Setup: func(ctx context.Context, e *envtest.Env) error {
			env, admin, cfg = e, e.Admin, e.Config
			return e.GrantUsersAccess(ctx)
		},
	})
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns, err := env.Namespace(t.Context(), "lw")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
