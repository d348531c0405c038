package restore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// localWebhookURL is where config/local points the API server's webhook
// calls: the manager as a local process on port 9443.
const localWebhookURL = "https://localhost:9443/"

// controlPlane is etcd and kube-apiserver from bin/, started by envtest
// with a data directory and a certificate directory of our own: envtest
// then neither deletes nor regenerates them when a component stops, so that
// both can be started again on the same URLs with the same certificates
// (clients and kubeconfigs stay valid), and etcd's data directory can be
// replaced by a restored snapshot in between.
type controlPlane struct {
	env *envtest.Environment
	// etcdDir is etcd's data directory.
	etcdDir string
	// etcdutl is bin/etcdutl.
	etcdutl string
	// adminKubeconfig authenticates as a member of system:masters.
	adminKubeconfig string
}

// startControlPlane starts etcd and kube-apiserver from assets and installs
// the CRDs in crds. On error nothing is left running.
func startControlPlane(assets, crds, dir string) (*controlPlane, error) {
	cp := &controlPlane{
		etcdDir: filepath.Join(dir, "etcd"),
		etcdutl: filepath.Join(assets, "etcdutl"),
	}
	certDir := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cp.etcdutl); err != nil {
		return nil, fmt.Errorf("bin/etcdutl is missing (hack/build-tools.sh etcd builds it): %w", err)
	}
	cp.env = &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	etcdLog, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	apiLog, err := os.Create(filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	cp.env.ControlPlane.Etcd = &envtest.Etcd{DataDir: cp.etcdDir, Out: etcdLog, Err: etcdLog}
	cp.env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir, Out: apiLog, Err: apiLog}
	// Without this, a graceful stop waits for the manager's open watches
	// until the HTTP server's 60 s shutdown timeout; with it, the server
	// drains requests in flight and closes the rest after 2 s.
	cp.env.ControlPlane.APIServer.Configure().Set("shutdown-send-retry-after", "true")
	if _, err := cp.env.Start(); err != nil {
		_ = cp.env.Stop()
		return nil, err
	}
	cp.adminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(cp.adminKubeconfig, cp.env.KubeConfig, 0o600); err != nil {
		cp.stop()
		return nil, err
	}
	return cp, nil
}

func (cp *controlPlane) adminConfig() *rest.Config { return cp.env.Config }

// addUser provisions a client-certificate identity; it returns its REST
// config and a kubeconfig file for it.
func (cp *controlPlane) addUser(u envtest.User, dir string) (*rest.Config, string, error) {
	au, err := cp.env.AddUser(u, &rest.Config{QPS: 1000, Burst: 2000})
	if err != nil {
		return nil, "", fmt.Errorf("adding user %s: %w", u.Name, err)
	}
	kc, err := au.KubeConfig()
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, strings.NewReplacer(":", "_", "/", "_").Replace(u.Name)+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return nil, "", err
	}
	return au.Config(), path, nil
}

// kubectl runs bin/kubectl as the admin, with stdin; it returns the output.
func (cp *controlPlane) kubectl(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, cp.env.ControlPlane.KubectlPath, append([]string{"--kubeconfig", cp.adminKubeconfig}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// applyLocalConfig installs config/local as `kubectl apply -k config/local`
// does, with the webhook URLs moved from port 9443 to port: the manager of
// this package must not take 9443 from test/e2e or `make demo` running
// beside it.
func (cp *controlPlane) applyLocalConfig(ctx context.Context, dir string, port int) error {
	rendered, err := cp.kubectl(ctx, nil, "kustomize", dir)
	if err != nil {
		return err
	}
	if !bytes.Contains(rendered, []byte(localWebhookURL)) {
		return fmt.Errorf("config/local no longer points webhooks at %s; update this test", localWebhookURL)
	}
	rendered = bytes.ReplaceAll(rendered, []byte(localWebhookURL), fmt.Appendf(nil, "https://localhost:%d/", port))
	_, err = cp.kubectl(ctx, rendered, "apply", "-f", "-")
	return err
}

// etcdURL is etcd's client URL.
func (cp *controlPlane) etcdURL() string { return cp.env.ControlPlane.Etcd.URL.String() }

// apiServerURL is kube-apiserver's secure URL.
func (cp *controlPlane) apiServerURL() string {
	return cp.env.ControlPlane.APIServer.SecureServing.URL("https", "/").String()
}

// saveSnapshot saves an etcd snapshot to path with the etcd client's
// Maintenance API, as `etcdctl snapshot save` does: the server streams its
// backend database followed by its SHA-256, which `etcdutl snapshot
// restore` verifies.
func (cp *controlPlane) saveSnapshot(ctx context.Context, path string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cp.etcdURL()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("requesting a snapshot: %w", err)
	}
	defer rc.Close()
	part := path + ".part"
	f, err := os.Create(part)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("receiving the snapshot: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(part, path)
}

// restore stops kube-apiserver and etcd, restores the snapshot into etcd's
// data directory with
//
//	etcdutl snapshot restore SNAPSHOT --data-dir DIR --bump-revision BUMP --mark-compacted
//
// and starts etcd and kube-apiserver again on the same URLs. Bumping the
// revision past every revision the old etcd reached, and marking it
// compacted, makes every watcher (the manager's informers, the API server's
// own watch cache) get 410 Gone and relist; a plain restore would move
// resourceVersions back silently, and clients would keep caches of objects
// that no longer exist. It returns etcdutl's output.
func (cp *controlPlane) restore(ctx context.Context, snap string, bump uint64) (string, error) {
	etcdURL, apiURL := cp.etcdURL(), cp.apiServerURL()
	if err := cp.env.ControlPlane.APIServer.Stop(); err != nil {
		return "", fmt.Errorf("stopping kube-apiserver: %w", err)
	}
	if err := cp.env.ControlPlane.Etcd.Stop(); err != nil {
		return "", fmt.Errorf("stopping etcd: %w", err)
	}
	if err := os.RemoveAll(cp.etcdDir); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, cp.etcdutl, "snapshot", "restore", snap, "--data-dir", cp.etcdDir,
		"--bump-revision", strconv.FormatUint(bump, 10), "--mark-compacted")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("etcdutl snapshot restore: %w\n%s", err, out)
	}
	if err := cp.env.ControlPlane.Etcd.Start(); err != nil {
		return string(out), fmt.Errorf("starting etcd on the restored data: %w", err)
	}
	if err := cp.env.ControlPlane.APIServer.Start(); err != nil {
		return string(out), fmt.Errorf("starting kube-apiserver again: %w", err)
	}
	if got := cp.etcdURL(); got != etcdURL {
		return string(out), fmt.Errorf("etcd came back on %s, not %s", got, etcdURL)
	}
	if got := cp.apiServerURL(); got != apiURL {
		return string(out), fmt.Errorf("kube-apiserver came back on %s, not %s", got, apiURL)
	}
	return string(out), cp.waitServing(ctx)
}

// waitServing waits until the API server serves lockwarden's kinds again
// to the clients made before the restart (same URL, same CA, same client
// certificates), and admission reaches the manager's webhooks.
func (cp *controlPlane) waitServing(ctx context.Context) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		iss := &lockingv1alpha1.FenceIssuer{}
		last = admin.Get(ctx, client.ObjectKey{Name: lockingv1alpha1.DefaultFenceIssuerName}, iss)
		if last != nil {
			return false, nil
		}
		if last = admin.List(ctx, &lockingv1alpha1.LockGrantList{}); last != nil {
			return false, nil
		}
		// The API server calls the manager's webhooks again.
		if why := localcp.ProbeWebhook(ctx, admin); why != "" {
			last = errors.New(why)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return errors.Join(fmt.Errorf("the API server did not serve lockwarden's kinds after the restart: %w", err), last)
	}
	return nil
}

// stop stops kube-apiserver and etcd.
func (cp *controlPlane) stop() {
	if err := cp.env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "warning: stopping the control plane: %v\n", err)
	}
}
