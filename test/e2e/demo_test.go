package e2e

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository root, from this package's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// build compiles a main package of the repository into dir.
func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", out, pkg)
	cmd.Dir = repoRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// TestDemo runs what `make demo` runs: a paused holder's late write must be
// refused with STALE_OWNER and the object must keep its successor's data,
// with two real worker processes under two service-account identities.
func TestDemo(t *testing.T) {
	root := repoRoot(t)
	assets := filepath.Join(root, "bin")
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		t.Fatalf("bin/kube-apiserver is missing; run `make tools` (make test does): %v", err)
	}
	dir := t.TempDir()
	manager := build(t, dir, "./cmd/manager")
	demo := build(t, dir, "./cmd/lockwarden-demo")

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
		`locking.lockwarden.io/fence: "2"`,
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
