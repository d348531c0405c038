package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/testenv"
)

var (
	env *testenv.Env
	// admin is a client with cluster-admin rights.
	admin client.Client
	// cfg is the admin rest config; users impersonate from it.
	cfg *rest.Config
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

// managerNamespace holds the issuer's keys and trust bundle.
const managerNamespace = testenv.ManagerNamespace

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, _ := filepath.Abs("../..")
	clk = clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	var err error
	if env, err = testenv.Start(root, clk); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Stop()
	admin, cfg = env.Admin, env.Config
	if err := env.GrantUsersAccess(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
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
