package install

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

const testImage = "example.com/lockwarden/lockwarden:install-test"

func strconvFormat(f int64) string { return strconv.FormatInt(f, 10) }

// TestInstallYAML: `make build-installer` writes dist/install.yaml, which
// server-side apply accepts whole; the manager runs as its Deployment says
// and the story passes; `make undeploy` leaves the cluster writable and
// keeps every fence; `make deploy` continues them.
func TestInstallYAML(t *testing.T) {
	c := startCluster(t)
	kubectl := "KUBECTL=" + c.kubectl()
	c.run("make", "--no-print-directory", "build-installer", "IMG="+testImage, "DIST="+c.dir, kubectl)
	manifest, err := os.ReadFile(filepath.Join(c.dir, "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(manifest), "image: "+testImage) {
		t.Fatalf("install.yaml does not run image %s", testImage)
	}
	for _, kind := range []string{"CustomResourceDefinition", "Deployment", "PodDisruptionBudget", "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Service", "Role"} {
		if !strings.Contains(string(manifest), "\nkind: "+kind+"\n") {
			t.Errorf("install.yaml has no %s", kind)
		}
	}
	t.Log(c.serverSideApply(string(manifest)))

	m := c.startManager()
	c.checkSecureMetrics(m)
	a, b := c.userClient("worker-a"), c.userClient("worker-b")
	const resource = "invoice-batch/2026-07-19"
	fence := c.playPausedHolder(a, b, resource)
	c.enforcePolicy()
	before := c.fenceState()

	// The Deployment's pods go first (make undeploy waits for them).
	m.Stop()
	out := c.run("make", "--no-print-directory", "undeploy", kubectl)
	if !strings.Contains(out, "CRDs kept") {
		t.Errorf("make undeploy does not say that it kept the CRDs:\n%s", out)
	}
	c.finalizeNamespace(systemNamespace)
	c.checkWritable()
	c.checkFencesKept(before)

	c.run("make", "--no-print-directory", "deploy", "IMG="+testImage, kubectl)
	c.startManager()
	c.waitRuntimeWebhook()
	if next := c.acquireOnce(b, resource); next <= fence {
		t.Errorf("after reinstalling, the next fence is %d, not above %d", next, fence)
	}
}

// TestHelmChart: the chart installs with helm, the manager runs as its
// Deployment says and the story passes; `helm uninstall` keeps the CRDs,
// the FenceCounters and the FenceIssuer and leaves the manager's runtime
// webhook configuration to the garbage collector (owned by a configuration
// helm deleted); reinstalling continues the fences. The HA/cert-manager
// values are accepted by server-side apply (a dry run, between the two
// installs).
func TestHelmChart(t *testing.T) {
	c := startCluster(t)
	helm := filepath.Join(c.root, "bin", "helm")
	install := []string{"install", "lockwarden", "charts/lockwarden", "--namespace", systemNamespace, "--create-namespace", "--set", "image.tag=install-test"}
	c.run(helm, install...)
	m := c.startManager()
	a, b := c.userClient("worker-a"), c.userClient("worker-b")
	const resource = "invoice-batch/2026-07-20"
	fence := c.playPausedHolder(a, b, resource)
	c.enforcePolicy()
	before := c.fenceState()

	m.Stop()
	c.run(helm, "uninstall", "lockwarden", "--namespace", systemNamespace)
	c.checkFencesKept(before)
	c.checkRuntimeWebhookOrphaned()
	// HA with cert-manager, on a cluster with cert-manager and the
	// Prometheus Operator (their CRDs, minimal): every object is accepted.
	c.serverSideApply(stubCRDs)
	rendered := c.run(helm, "template", "lockwarden", "charts/lockwarden", "--namespace", systemNamespace, "-f", "charts/lockwarden/ci/ha-certmanager-values.yaml")
	t.Log(c.serverSideApply(rendered, "--dry-run=server", "--force-conflicts"))

	c.run(helm, install...)
	c.startManager()
	c.waitRuntimeWebhook()
	if next := c.acquireOnce(b, resource); next <= fence {
		t.Errorf("after reinstalling, the next fence is %d, not above %d", next, fence)
	}
}

// TestRecoveryAfterLostCounters follows docs/install.md's recovery for lost
// FenceCounters: an object recorded a fence of epoch 2 before the CRDs were
// deleted; hack/next-epoch.sh finds epoch 3; the FenceIssuer is created at
// that epoch, with the earlier ones revoked, before the manager starts; the
// first grant's fence is then above the object's, which accepts the write.
func TestRecoveryAfterLostCounters(t *testing.T) {
	c := startCluster(t)
	kubectl := "KUBECTL=" + c.kubectl()
	c.run("make", "--no-print-directory", "install", kubectl)
	c.ensureNamespace(billing)
	const resource = "ledger/2026"
	recorded := int64(2)<<40 | 7
	ledger := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: billing, Name: "ledger",
		Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"},
		Annotations: map[string]string{
			lockingv1alpha1.ResourceAnnotation:      resource,
			lockingv1alpha1.AcceptedGrantAnnotation: billing + "/before-the-loss",
			lockingv1alpha1.AcceptedFenceAnnotation: strconv.FormatInt(recorded, 10),
		},
	}}
	if err := c.admin.Create(t.Context(), ledger); err != nil {
		t.Fatal(err)
	}

	epoch := strings.TrimSpace(c.stdout("env", kubectl, "hack/next-epoch.sh"))
	if epoch != "3" {
		t.Fatalf("hack/next-epoch.sh = %q, want 3 (the object recorded a fence of epoch 2)", epoch)
	}
	c.serverSideApply(`apiVersion: locking.lockwarden.io/v1alpha1
kind: FenceIssuer
metadata:
  name: default
spec:
  epoch: ` + epoch + `
  revokedEpochs: [0, 1, 2]
  signingKeys:
  - keyID: k1
    state: Active
`)
	c.run("make", "--no-print-directory", "deploy", "IMG="+testImage, kubectl)
	c.startManager()
	b := c.userClient("worker-b")
	h, err := lock.NewClient(b, lock.WithNamespace(billing)).Acquire(t.Context(), resource, lock.WithTTL(30*time.Second), lock.WithWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Release(context.WithoutCancel(t.Context())) }()
	if h.Info().Fence>>40 != 3 || h.Info().Fence <= recorded {
		t.Fatalf("the first fence after recovery is %d (epoch %d), want epoch 3, above %d", h.Info().Fence, h.Info().Fence>>40, recorded)
	}
	if err := b.Get(t.Context(), client.ObjectKeyFromObject(ledger), ledger); err != nil {
		t.Fatal(err)
	}
	if err := h.Stamp(ledger); err != nil {
		t.Fatal(err)
	}
	ledger.Data = map[string]string{"total": "after recovery"}
	if err := b.Update(t.Context(), ledger); err != nil {
		t.Fatalf("the write with fence %d after recovery was refused: %v", h.Info().Fence, err)
	}
}
