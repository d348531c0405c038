// Command pause writes the test cluster's Pod sandbox image as a tarball,
// without a container runtime or a registry: one layer holding the static
// pause program at /pause, run as the numeric user 65535 as the Kubernetes
// pause image is. containerd imports it (`ctr -n k8s.io images import`) and
// its CRI plugin names it as sandbox_image, so no Pod ever pulls it.
//
// Usage (see hack/build-tools.sh pause):
//
//	go run . -binary ../../../bin/pause -image registry.k8s.io/pause:3.10-lockwarden -out ../../../bin/pause.tar
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	binary := flag.String("binary", "", "Static pause binary for linux/GOARCH (required).")
	image := flag.String("image", "registry.k8s.io/pause:3.10-lockwarden", "Name recorded in the tarball: containerd's sandbox_image.")
	out := flag.String("out", "", "Tarball to write (required).")
	flag.Parse()
	if err := run(*binary, *image, *out); err != nil {
		fmt.Fprintln(os.Stderr, "pause:", err)
		os.Exit(1)
	}
}

func run(binary, image, out string) error {
	if binary == "" || out == "" {
		return errors.New("-binary and -out are required")
	}
	tag, err := name.NewTag(image)
	if err != nil {
		return fmt.Errorf("-image: %w", err)
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := tw.Write(bin); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("building the layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.User = "65535:65535"
	cf.Config.Entrypoint = []string{"/pause"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("writing the image config: %w", err)
	}
	if err := tarball.WriteToFile(out+".tmp", tag, img); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return os.Rename(out+".tmp", out)
}
