package gated

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/testenv"
)

var (
	env *testenv.Env
	// admin is a client with cluster-admin rights; in envtest the manager
	// runs as the same identity.
	admin client.WithWatch
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

func TestMain(m *testing.M) {
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	root, _ := filepath.Abs("../..")
	clk = clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	var err error
	if env, err = testenv.Start(root, clk); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Stop()
	admin = env.Admin
	return m.Run()
}
