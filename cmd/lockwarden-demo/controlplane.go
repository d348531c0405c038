package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// controlPlane is a local etcd + kube-apiserver started by envtest, with an
// admin kubeconfig on disk.
type controlPlane struct {
	env *envtest.Environment
	// dir holds the kubeconfigs written for this run.
	dir string
	// adminConfig and adminKubeconfig authenticate as a member of
	// system:masters.
	adminConfig     *rest.Config
	adminKubeconfig string
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
	cp := &controlPlane{env: env, dir: dir, adminConfig: cfg}
	cp.adminKubeconfig, err = cp.writeKubeconfig("admin", env.KubeConfig)
	if err != nil {
		cp.stop()
		return nil, err
	}
	return cp, nil
}

// addUser provisions a client-certificate identity and writes its
// kubeconfig to the run directory, returning the path.
func (cp *controlPlane) addUser(file string, u envtest.User) (string, error) {
	au, err := cp.env.AddUser(u, nil)
	if err != nil {
		return "", fmt.Errorf("adding user %s: %w", u.Name, err)
	}
	kc, err := au.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig of %s: %w", u.Name, err)
	}
	return cp.writeKubeconfig(file, kc)
}

func (cp *controlPlane) writeKubeconfig(name string, content []byte) (string, error) {
	p := filepath.Join(cp.dir, name+".kubeconfig")
	if err := os.WriteFile(p, content, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", p, err)
	}
	return p, nil
}

// kubectl runs kubectl as the admin; its output is shown only on failure.
func (cp *controlPlane) kubectl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, cp.env.ControlPlane.KubectlPath, append([]string{"--kubeconfig", cp.adminKubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// applyLocalConfig installs the kustomization at dir (config/local), with
// the webhook URLs moved from port 9443 to port when they differ.
func (cp *controlPlane) applyLocalConfig(ctx context.Context, dir string, port int) error {
	render := exec.CommandContext(ctx, cp.env.ControlPlane.KubectlPath, "kustomize", dir)
	out, err := render.Output()
	if err != nil {
		return fmt.Errorf("kubectl kustomize %s: %w", dir, err)
	}
	manifests := strings.ReplaceAll(string(out), "https://localhost:"+strconv.Itoa(defaultWebhookPort)+"/", "https://localhost:"+strconv.Itoa(port)+"/")
	apply := exec.CommandContext(ctx, cp.env.ControlPlane.KubectlPath, "--kubeconfig", cp.adminKubeconfig, "apply", "-f", "-")
	apply.Stdin = strings.NewReader(manifests)
	if b, err := apply.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, b)
	}
	return nil
}

// stop stops kube-apiserver and etcd.
func (cp *controlPlane) stop() {
	if err := cp.env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "warning: stopping the control plane: %v\n", err)
	}
}
