package install

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
