package chaos

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// TestChaos runs about a minute of the chaos suite and requires every check
// of the history to pass. The run directory (logs, history) is kept when
// the test fails.
func TestChaos(t *testing.T) {
	root := envtest.Repo(t, "../..")
	assets := filepath.Join(root, "bin")
	bins := t.TempDir()
	manager := envtest.Build(t, root, bins, "./cmd/manager")
	chaos := envtest.Build(t, filepath.Join(root, "test"), bins, "./cmd/lockwarden-chaos")
	runDir, err := os.MkdirTemp("", "lockwarden-chaos-test-")
	if err != nil {
		t.Fatal(err)
	}

	// Set-up and checking take well under a minute even on a loaded
	// 2-core machine; the deadline is only there to bound a hung run.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chaos,
		"--assets", assets, "--manager", manager, "--dir", runDir,
		"--duration", "60s", "--workers", "5", "--resources", "2", "--manager-kill-every", "30s")
	cmd.Dir = root
	// Ctrl-C-like stop on the deadline, so the run stops what it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("lockwarden-chaos output:\n%s", out.String())
	if err != nil {
		t.Fatalf("the chaos run failed: %v (run directory kept: %s)", err, runDir)
	}
	for _, want := range []string{
		"accepted fences never decrease per object ",
		"no acknowledged write lost ",
		"no write of an expired or superseded grant accepted ",
		"no request asserting nothing accepted (patch, delete) ",
		"at most one Held grant per resource at any controller time ",
		"linearizable: fenced lock per resource (porcupine) ",
		"linearizable: CAS register per object (porcupine) ",
		"the run itself (observer, failover, quiescence) ",
	} {
		line := lineWith(out.String(), want)
		if !strings.Contains(line, " ok ") {
			t.Errorf("check %q did not pass: %q", strings.TrimSpace(want), line)
		}
	}
	if !strings.Contains(out.String(), "PASS:") {
		t.Errorf("the output lacks PASS (run directory kept: %s)", runDir)
	}
	if !t.Failed() {
		os.RemoveAll(runDir)
	}
}

// lineWith returns the first line of s containing sub.
func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
