package envtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Repo returns the repository root, rel being the path from the test's
// package directory to it (e.g. "../.."), and fails the test when bin/ has
// no control plane yet. Under -short it skips the test: what needs bin/ is
// not a unit test.
func Repo(t testing.TB, rel string) string {
	t.Helper()
	SkipShort(t, "it runs the tools in bin/")
	root, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin", "kube-apiserver")); err != nil {
		t.Fatalf("bin/kube-apiserver is missing; run `make tools` (make test does): %v", err)
	}
	return root
}

// Build compiles the main package pkg (e.g. "./cmd/manager") of the Go
// module whose directory is root (the repository, or its test module in
// test/) into dir and returns the binary's path. Under -short it skips the
// test.
func Build(t testing.TB, root, dir, pkg string) string {
	t.Helper()
	SkipShort(t, "it builds "+pkg)
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
