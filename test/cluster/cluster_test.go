package cluster

import "testing"

// TestCluster runs the real-node suite, in order: each step leaves the
// release installed for the next, and each installs it again when run
// alone (-run 'TestCluster/outage').
func TestCluster(t *testing.T) {
	for _, step := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"install.yaml", testInstallYAML},
		{"helm", testHelmInstall},
		{"outage", testOutage},
		{"paused-holder", testPausedHolder},
		{"gated-job", testGatedJob},
		{"gated-frozen", testGatedFrozen},
		{"gated-deletion", testGatedDeletion},
		{"gated-figures", testGatedFigures},
		{"restarts", testRestarts},
		{"namespace-deletion", testNamespaceDeletion},
		{"garbage-collector", testGarbageCollector},
		{"uninstall-keeps-fences", testUninstallKeepsFences},
		{"webhook-secret-deleted", testWebhookSecretDeleted},
		{"rolling-upgrade", testRollingUpgrade},
	} {
		t.Run(step.name, step.run)
	}
}
