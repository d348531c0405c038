package e2e

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// TestDemo runs what `make demo` runs: a paused holder's late write must be
// refused with STALE_OWNER and the object must keep its successor's data,
// with two real worker processes under two service-account identities.
func TestDemo(t *testing.T) {
	root := envtest.Repo(t, "../..")
	assets := filepath.Join(root, "bin")
	dir := t.TempDir()
	manager := envtest.Build(t, root, dir, "./cmd/manager")
	demo := envtest.Build(t, filepath.Join(root, "test"), dir, "./cmd/lockwarden-demo")

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	// A free webhook port, so that this test never competes with another
	// local manager (make demo, or another package's test) for 9443.
	cmd := exec.CommandContext(ctx, demo, "--assets", assets, "--manager", manager, "--webhook-port", strconv.Itoa(freePort(t)))
	cmd.Dir = root
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("the demo failed: %v", err)
	}
	for _, want := range []string{
		"FROZEN (SIGSTOP)",
		"REJECTED STALE_OWNER",
		`result: "B: correct total"`,
		`locking.lockwarden.io/accepted-fence: "2"`,
		"PASS:",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo output lacks %q", want)
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
