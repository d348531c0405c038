package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// controlPlane is a local etcd + kube-apiserver started by envtest, with an
// admin kubeconfig on disk.
type controlPlane struct {
	env *envtest.Environment
	// dir holds the kubeconfigs and logs of this run.
	dir string
	// adminConfig authenticates as a member of system:masters.
	adminConfig     *rest.Config
	adminKubeconfig string
	// etcdURL is the client URL of envtest's etcd.
	etcdURL string
}

// startControlPlane starts etcd and kube-apiserver from o.assets and installs
// the CRDs in o.crds. On error nothing is left running.
func startControlPlane(o options, dir string) (*controlPlane, error) {
	env := &envtest.Environment{
		BinaryAssetsDirectory: o.assets,
		CRDDirectoryPaths:     []string{o.crds},
		ErrorIfCRDPathMissing: true,
		Scheme:                newScheme(),
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("starting the control plane from %s: %w", o.assets, err)
	}
	cp := &controlPlane{env: env, dir: dir, adminConfig: cfg, etcdURL: env.ControlPlane.Etcd.URL.String()}
	cp.adminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(cp.adminKubeconfig, env.KubeConfig, 0o600); err != nil {
		cp.stop()
		return nil, fmt.Errorf("writing %s: %w", cp.adminKubeconfig, err)
	}
	return cp, nil
}

// clientConfig returns a copy of the admin config with client-side rate
// limiting off and its own TCP connection: a custom dialer makes client-go
// build a transport of its own instead of sharing the cached one, so every
// actor talks to the API server like a separate process would.
func (cp *controlPlane) clientConfig() *rest.Config {
	c := rest.CopyConfig(cp.adminConfig)
	c.QPS, c.Burst = -1, 0
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	c.Dial = d.DialContext
	c.WarningHandler = rest.NoWarnings{}
	c.Timeout = 0
	return c
}

// newClient is a controller-runtime client with its own connection.
func (cp *controlPlane) newClient() (client.WithWatch, error) {
	return client.NewWithWatch(cp.clientConfig(), client.Options{Scheme: newScheme()})
}

// installLocalConfig applies config/local with kubectl, with the webhook
// URLs moved from localhost:9443 to localhost:port, so that a `make demo`
// or `make run` elsewhere on the machine does not collide with the bench.
func (cp *controlPlane) installLocalConfig(ctx context.Context, kustomization string, port int) error {
	out, err := cp.kubectl(ctx, nil, "kustomize", kustomization)
	if err != nil {
		return err
	}
	const from = "https://localhost:9443/"
	if !bytes.Contains(out, []byte(from)) {
		return fmt.Errorf("%s has no webhook URL %s to move to port %d", kustomization, from, port)
	}
	out = bytes.ReplaceAll(out, []byte(from), []byte(fmt.Sprintf("https://localhost:%d/", port)))
	_, err = cp.kubectl(ctx, out, "apply", "-f", "-")
	return err
}

// kubectl runs kubectl as the admin; its output is shown only on failure.
func (cp *controlPlane) kubectl(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, cp.env.ControlPlane.KubectlPath, append([]string{"--kubeconfig", cp.adminKubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// stop stops kube-apiserver and etcd.
func (cp *controlPlane) stop() {
	if err := cp.env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "warning: stopping the control plane: %v\n", err)
	}
}
