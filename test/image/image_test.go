// Package image checks the manager's container image as `make image`
// writes it: the tarball is built with hack/tools/image from a static
// linux/amd64 manager, then opened with the standard library alone, as
// `docker load` would read it.
package image

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

type manifestEntry struct {
	Config   string
	RepoTags []string
	Layers   []string
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

func TestImageTarball(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: it builds the manager and its image; make test-e2e and make test run it")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "manager")
	run(t, root, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X github.com/lockwarden/lockwarden/internal/version.Version=v9.8.7-test",
		"-o", bin, "./cmd/manager")
	tarball := filepath.Join(dir, "image.tar")
	run(t, root, nil, "go", "-C", "hack/tools/image", "run", ".", "-binary", bin, "-arch", "amd64",
		"-image", "example.com/lockwarden:v9.8.7-test", "-version", "v9.8.7-test", "-out", tarball)

	files := readTar(t, tarball)
	var manifest []manifestEntry
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(manifest) != 1 || !slices.Contains(manifest[0].RepoTags, "example.com/lockwarden:v9.8.7-test") {
		t.Fatalf("manifest.json = %+v, want one image tagged example.com/lockwarden:v9.8.7-test", manifest)
	}
	var cfg imageConfig
	if err := json.Unmarshal(files[manifest[0].Config], &cfg); err != nil {
		t.Fatalf("config %s: %v", manifest[0].Config, err)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("User = %q, want the numeric non-root 65532:65532", cfg.Config.User)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/manager"}) {
		t.Errorf("Entrypoint = %v, want [/manager]", cfg.Config.Entrypoint)
	}
	if cfg.Architecture != "amd64" || cfg.OS != "linux" {
		t.Errorf("platform = %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
	}
	if v := cfg.Config.Labels["org.opencontainers.image.version"]; v != "v9.8.7-test" {
		t.Errorf("version label = %q", v)
	}
	if len(manifest[0].Layers) != 1 {
		t.Fatalf("layers = %v, want one", manifest[0].Layers)
	}
	layer := readLayer(t, files[manifest[0].Layers[0]])
	if !strings.Contains(string(layer["etc/passwd"]), ":65532:65532:") {
		t.Errorf("/etc/passwd has no user 65532:\n%s", layer["etc/passwd"])
	}
	managerBin := layer["manager"]
	if len(managerBin) == 0 {
		t.Fatalf("no /manager in the layer (files: %v)", keys(layer))
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("the binary is for linux/amd64; this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	extracted := filepath.Join(dir, "manager-from-image")
	if err := os.WriteFile(extracted, managerBin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), extracted, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("/manager --version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "lockwarden manager v9.8.7-test") {
		t.Errorf("/manager --version printed %q", out)
	}
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// readTar returns every regular file of a tar archive by name.
func readTar(t *testing.T, p string) map[string][]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return files(t, tar.NewReader(f))
}

func readLayer(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	zr, err := gzip.NewReader(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	return files(t, tar.NewReader(zr))
}

func files(t *testing.T, tr *tar.Reader) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[path.Clean(strings.TrimPrefix(h.Name, "/"))] = b
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
