package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The targets of the real-node suite.
const (
	installTarget = 40 * time.Second
	recoverTarget = 60 * time.Second
)

// managerPods selects the manager's Pods.
var managerPods = client.MatchingLabels{"control-plane": "controller-manager"}

// imageParts splits an image reference into repository and tag.
func imageParts(img string) (string, string) {
	i := strings.LastIndex(img, ":")
	if i < 0 || strings.Contains(img[i:], "/") {
		return img, "latest"
	}
	return img[:i], img[i+1:]
}

// helmInstall installs the chart as the README says, with img, and waits
// until it is Ready and its webhooks answer through the Service; it returns
// how long that took.
func helmInstall(t *testing.T, img string, extra ...string) time.Duration {
	t.Helper()
	repo, tag := imageParts(img)
	start := time.Now()
	args := append([]string{"install", release, "charts/lockwarden", "-n", releaseNamespace, "--create-namespace",
		"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--wait", "--timeout", "3m"}, extra...)
	must(t)(helm(t.Context(), args...))
	served(t)
	return time.Since(start)
}

// helmUninstall uninstalls the release as the README says and waits until
// nothing of it runs or intercepts any more.
func helmUninstall(t *testing.T) {
	t.Helper()
	must(t)(helm(t.Context(), "uninstall", release, "-n", releaseNamespace, "--wait", "--timeout", "2m"))
	gone(t)
}

// installer writes dist/install.yaml for img as the README says (make
// build-installer) and returns its path.
func installer(t *testing.T, img string) string {
	t.Helper()
	must(t)(run(t.Context(), "make", "-C", env.root, "--no-print-directory", "build-installer", "IMG="+img))
	return filepath.Join(env.root, "dist", "install.yaml")
}

// yamlInstall applies install.yaml as the README says and waits until the
// manager is Ready and its webhooks answer through the Service.
func yamlInstall(t *testing.T, manifest string) time.Duration {
	t.Helper()
	start := time.Now()
	must(t)(kubectl(t.Context(), "apply", "--server-side", "-f", manifest))
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "rollout", "status", "deployment/"+deployment, "--timeout=3m"))
	served(t)
	return time.Since(start)
}

// yamlUninstall removes what install.yaml installed, keeping the CRDs, as
// the README says (what hack/undeploy.sh does), and waits until its
// namespace is gone.
func yamlUninstall(t *testing.T) {
	t.Helper()
	must(t)(run(t.Context(), filepath.Join(env.root, "hack", "undeploy.sh"), filepath.Join(env.root, "bin", "kubectl"), "false"))
	gone(t)
	eventually(t, "namespace "+releaseNamespace+" is deleted", 2*time.Minute, func(ctx context.Context) (bool, error) {
		err := env.c.Get(ctx, types.NamespacedName{Name: releaseNamespace}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), err
	})
}

// served waits until the webhook Service has a ready endpoint and a
// request that needs the webhooks gets their answer through it: the
// mutating LockGrant webhook names the requester as the owner of a server
// dry-run create. Pod Ready alone is not enough: the endpoint and
// kube-proxy's rules follow it.
func served(t *testing.T) {
	t.Helper()
	eventually(t, "the webhook Service has a ready endpoint", time.Minute, func(ctx context.Context) (bool, error) {
		var slices discoveryv1.EndpointSliceList
		if err := env.c.List(ctx, &slices, client.InNamespace(releaseNamespace), client.MatchingLabels{discoveryv1.LabelServiceName: webhookService}); err != nil {
			return false, err
		}
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					return true, nil
				}
			}
		}
		return false, nil
	})
	sample := filepath.Join(env.root, "config", "samples", "locking_v1alpha1_lockgrant.yaml")
	eventually(t, "the webhooks answer through the Service", time.Minute, func(ctx context.Context) (bool, error) {
		out, err := kubectl(ctx, "-n", "default", "create", "--dry-run=server", "-f", sample, "-o", "jsonpath={.spec.owner}")
		return err == nil && out == "kubernetes-admin", err
	})
}

// gone waits until no manager Pod runs and no lockwarden webhook
// configuration is left (the GuardPolicy ones go by the garbage collector).
func gone(t *testing.T) {
	t.Helper()
	eventually(t, "the manager's Pods and webhook configurations are gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.c.List(ctx, &pods, client.InNamespace(releaseNamespace), managerPods); err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		var v admissionregistrationv1.ValidatingWebhookConfigurationList
		var m admissionregistrationv1.MutatingWebhookConfigurationList
		if err := env.c.List(ctx, &v); err != nil {
			return false, err
		}
		if err := env.c.List(ctx, &m); err != nil {
			return false, err
		}
		left := len(pods.Items)
		for _, c := range v.Items {
			if strings.HasPrefix(c.Name, "lockwarden-") {
				left++
			}
		}
		for _, c := range m.Items {
			if strings.HasPrefix(c.Name, "lockwarden-") {
				left++
			}
		}
		return left == 0, fmt.Errorf("%d manager Pods and lockwarden webhook configurations left", left)
	})
}

// installed reports whether the Helm release is installed.
func installed(ctx context.Context) bool {
	out, err := helm(ctx, "status", release, "-n", releaseNamespace, "-o", "json")
	return err == nil && strings.Contains(out, `"status":"deployed"`)
}

// ensureRelease installs the chart with the image under test unless a
// release is installed.
func ensureRelease(t *testing.T) {
	t.Helper()
	if !installed(t.Context()) {
		adoptCRDs(t)
		helmInstall(t, *image)
		return
	}
	served(t)
}

// testInstallYAML applies install.yaml and removes it again, -installs
// times from scratch.
func testInstallYAML(t *testing.T) {
	if installed(t.Context()) {
		helmUninstall(t)
	}
	manifest := installer(t, *image)
	for i := range *installs {
		took := yamlInstall(t, manifest)
		record(t, "install.yaml applied -> Ready and served", took, installTarget)
		yamlUninstall(t)
		t.Logf("install.yaml round %d done", i+1)
	}
}

// adoptCRDs gives the CRDs an earlier install.yaml left Helm's ownership
// metadata, as the README says, so that the chart takes them over.
func adoptCRDs(t *testing.T) {
	t.Helper()
	out := must(t)(kubectl(t.Context(), "get", "crd", "-o", "name"))
	for _, crd := range strings.Fields(out) {
		if !strings.HasSuffix(crd, ".locking.lockwarden.io") {
			continue
		}
		must(t)(kubectl(t.Context(), "label", "--overwrite", crd, "app.kubernetes.io/managed-by=Helm"))
		must(t)(kubectl(t.Context(), "annotate", "--overwrite", crd, "meta.helm.sh/release-name="+release, "meta.helm.sh/release-namespace="+releaseNamespace))
	}
}

// testHelmInstall installs the chart with --wait and uninstalls it again,
// -installs times from scratch; the last install stays for the tests after.
// The CRDs install.yaml left behind are taken over as the README says.
func testHelmInstall(t *testing.T) {
	if installed(t.Context()) {
		helmUninstall(t)
	}
	adoptCRDs(t)
	for i := range *installs {
		took := helmInstall(t, *image)
		record(t, "helm install --wait -> Ready and served", took, installTarget)
		if i < *installs-1 {
			helmUninstall(t)
		}
	}
}
