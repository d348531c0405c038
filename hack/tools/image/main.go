// Command image writes the lockwarden manager's container image as a
// tarball, without a container runtime: one layer with the static manager
// binary at /manager, /etc/passwd and /etc/group naming the non-root user
// 65532 ("nonroot", as distroless images do) and a writable /tmp, on an
// empty base. The tarball is in the format `docker save` writes, with OCI
// media types, so `docker load`, `kind load image-archive`, `crane push` and
// `podman load` all read it.
//
// Usage (see `make image`):
//
//	go run . -binary ../../../bin/linux-amd64/manager -arch amd64 \
//	    -image ghcr.io/lockwarden/lockwarden:v0.1.0 -version v0.1.0 -out ../../../dist/lockwarden-manager-v0.1.0-linux-amd64.tar
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The user the manager runs as: numeric, so that Kubernetes can enforce
// runAsNonRoot without reading /etc/passwd.
const (
	uid     = 65532
	workdir = "/"
)

type options struct {
	binary, arch, image, version, revision, out, source string
	created                                             string
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "Static manager binary for linux/ARCH (required).")
	flag.StringVar(&o.arch, "arch", "amd64", "GOARCH of the binary: the image's architecture.")
	flag.StringVar(&o.image, "image", "ghcr.io/lockwarden/lockwarden:latest", "Repository and tag recorded in the tarball (what `docker load` names the image).")
	flag.StringVar(&o.version, "version", "dev", "Version label (org.opencontainers.image.version).")
	flag.StringVar(&o.revision, "revision", "", "Source revision label (org.opencontainers.image.revision).")
	flag.StringVar(&o.source, "source", "https://github.com/lockwarden/lockwarden", "Source repository label (org.opencontainers.image.source).")
	flag.StringVar(&o.created, "created", "1970-01-01T00:00:00Z", "Creation time (RFC 3339); fixed by default so that the same binary gives the same image.")
	flag.StringVar(&o.out, "out", "", "Tarball to write (required).")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.binary == "" || o.out == "" {
		return errors.New("-binary and -out are required")
	}
	created, err := time.Parse(time.RFC3339, o.created)
	if err != nil {
		return fmt.Errorf("-created: %w", err)
	}
	tag, err := name.NewTag(o.image)
	if err != nil {
		return fmt.Errorf("-image: %w", err)
	}
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return err
	}
	layerTar, err := rootfs(bin, created)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("building the layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "hack/tools/image: COPY manager /manager",
			Comment:   "lockwarden manager " + o.version,
		},
		MediaType: types.OCILayer,
	})
	if err != nil {
		return fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = o.arch
	cf.Created = v1.Time{Time: created}
	cf.Config.User = fmt.Sprintf("%d:%d", uid, uid)
	cf.Config.Entrypoint = []string{"/manager"}
	cf.Config.WorkingDir = workdir
	cf.Config.Env = []string{"PATH=/"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "lockwarden",
		"org.opencontainers.image.description": "lockwarden manager: fenced distributed locks for Kubernetes",
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.revision":    o.revision,
		"org.opencontainers.image.source":      o.source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return fmt.Errorf("writing the image config: %w", err)
	}
	if err := tarball.WriteToFile(o.out+".tmp", tag, img); err != nil {
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	if err := os.Rename(o.out+".tmp", o.out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s\t%s\t%s\n", o.out, tag, digest)
	return nil
}

// rootfs is the image's only layer.
func rootfs(bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name string
		mode int64
		dir  bool
		data []byte
		uid  int
	}{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, dir: true, uid: uid},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "manager", mode: 0o755, data: bin},
	}
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
