// Package localcp runs lockwarden on a local control plane: etcd and
// kube-apiserver from bin/ (through envtest), the webhook configuration of
// config/local, and the real manager binary as a child process. The demo, the
// benchmark, the chaos suite and the end-to-end tests all start it this way.
package localcp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// ControlPlane is a local etcd + kube-apiserver started by envtest, with an
// admin kubeconfig on disk.
type ControlPlane struct {
	// Env is the envtest environment (its ControlPlane has the etcd URL and
	// the kubectl path).
	Env *envtest.Environment
	// Dir holds the kubeconfigs written for this run.
	Dir string
	// AdminConfig and AdminKubeconfig authenticate as a member of
	// system:masters.
	AdminConfig     *rest.Config
	AdminKubeconfig string
}

// Start starts etcd and kube-apiserver from the binaries in assets, installs
// the CRDs found in crds, and writes kubeconfigs into dir. On error nothing
// is left running.
func Start(assets, crds, dir string, scheme *runtime.Scheme) (*ControlPlane, error) {
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("starting the control plane from %s: %w", assets, err)
	}
	cp := &ControlPlane{Env: env, Dir: dir, AdminConfig: cfg}
	cp.AdminKubeconfig, err = cp.WriteKubeconfig("admin", env.KubeConfig)
	if err != nil {
		cp.Stop()
		return nil, err
	}
	return cp, nil
}

// AddUser provisions a client-certificate identity and writes its
// kubeconfig to Dir as file.kubeconfig, returning the path.
func (cp *ControlPlane) AddUser(file string, u envtest.User) (string, error) {
	au, err := cp.Env.AddUser(u, nil)
	if err != nil {
		return "", fmt.Errorf("adding user %s: %w", u.Name, err)
	}
	kc, err := au.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig of %s: %w", u.Name, err)
	}
	return cp.WriteKubeconfig(file, kc)
}

// WriteKubeconfig writes content to Dir as name.kubeconfig.
func (cp *ControlPlane) WriteKubeconfig(name string, content []byte) (string, error) {
	p := filepath.Join(cp.Dir, name+".kubeconfig")
	if err := os.WriteFile(p, content, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", p, err)
	}
	return p, nil
}

// Kubectl runs kubectl as the admin; its output is shown only on failure.
func (cp *ControlPlane) Kubectl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, cp.Env.ControlPlane.KubectlPath, append([]string{"--kubeconfig", cp.AdminKubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// ApplyLocalConfig installs the kustomization at dir (config/local), with
// the webhook URLs moved from port 9443 to port when they differ.
func (cp *ControlPlane) ApplyLocalConfig(ctx context.Context, dir string, port int) error {
	render := exec.CommandContext(ctx, cp.Env.ControlPlane.KubectlPath, "kustomize", dir)
	out, err := render.Output()
	if err != nil {
		return fmt.Errorf("kubectl kustomize %s: %w", dir, err)
	}
	manifests := strings.ReplaceAll(string(out), "https://localhost:"+strconv.Itoa(DefaultWebhookPort)+"/", "https://localhost:"+strconv.Itoa(port)+"/")
	apply := exec.CommandContext(ctx, cp.Env.ControlPlane.KubectlPath, "--kubeconfig", cp.AdminKubeconfig, "apply", "-f", "-")
	apply.Stdin = strings.NewReader(manifests)
	if b, err := apply.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, b)
	}
	return nil
}

// Stop stops kube-apiserver and etcd.
func (cp *ControlPlane) Stop() {
	if err := cp.Env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "warning: stopping the control plane: %v\n", err)
	}
}
