package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// testRollingUpgrade installs the previous release as its README said (its
// own chart and image), starts holders and waiters, and upgrades to this
// tree's chart and image as this README says (helm upgrade --reuse-values
// --set image.tag=...): the replicas roll one at a time, no grant is lost,
// the fences continue, and the longest stall of the grant traffic is
// printed; then a rolling restart of the new release leaves no request
// undecided.
func testRollingUpgrade(t *testing.T) {
	if *previousMissing != "" {
		skipped(t, "rolling-upgrade", *previousMissing)
	}
	if *previousImage == "" || *previousChart == "" {
		t.Fatal("-previous-image and -previous-chart are required (make test-cluster builds them from PREVIOUS_REF)")
	}
	if installed(t.Context()) {
		helmUninstall(t)
	}
	adoptCRDs(t)
	record(t, "helm install (previous release) -> Ready and served", installPrevious(t), 0)
	ns := namespace(t, "upgrade")
	since := time.Now()
	tr := startTraffic(t, ns, 3, 2)
	tr.flowing(t, 10, time.Minute)

	_, tag := imageParts(*image)
	start := time.Now()
	must(t)(helm(t.Context(), "upgrade", release, "charts/lockwarden", "-n", releaseNamespace, "--reuse-values", "--set", "image.tag="+tag, "--wait", "--timeout", "3m"))
	eventually(t, "every manager Pod runs "+*image, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.c.List(ctx, &pods, client.InNamespace(releaseNamespace), managerPods); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.Spec.Containers[0].Image != *image || p.DeletionTimestamp != nil {
				return false, fmt.Errorf("Pod %s runs %s", p.Name, p.Spec.Containers[0].Image)
			}
		}
		return len(pods.Items) == 2, nil
	})
	served(t)
	record(t, "helm upgrade (rolling, under traffic) -> Ready", time.Since(start), 0)
	tr.flowing(t, 10, time.Minute)

	// A rolling restart of this release: each replica stops only after its
	// endpoint left the Service (preStop) and decides every request it
	// accepted before it exits, so no request is left undecided by a
	// stopping replica (a slow one still times out after 1 s).
	stopped := tr.stoppedSoFar()
	start = time.Now()
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "rollout", "restart", "deployment/"+deployment))
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "rollout", "status", "deployment/"+deployment, "--timeout=3m"))
	served(t)
	record(t, "rollout restart (under traffic) -> Ready", time.Since(start), 0)
	tr.flowing(t, 10, time.Minute)
	if n := tr.stoppedSoFar() - stopped; n > 0 {
		t.Errorf("in a rolling restart of this release, stopping replicas left %d requests undecided", n)
	}
	record(t, "longest grant stall: rolling upgrade and restart", tr.stop(t, since), 0)
}

// installPrevious installs the previous release's chart with its image as
// its README said, and returns how long it took until Ready and served.
// That release's guard-subresource webhook failed closed for every binding
// in the cluster, its manager's own Pods' included, so its install could
// hang; the suite gives it the exemption its admins had to add by hand.
func installPrevious(t *testing.T) time.Duration {
	t.Helper()
	repo, tag := imageParts(*previousImage)
	start := time.Now()
	must(t)(helm(t.Context(), "install", release, *previousChart, "-n", releaseNamespace, "--create-namespace",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag))
	exempt := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", releaseNamespace},
	}}}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := env.c.Get(t.Context(), types.NamespacedName{Name: "lockwarden-validating-webhook-configuration"}, cfg); err != nil {
			return err
		}
		for i, h := range cfg.Webhooks {
			if h.Name == "guard-subresource.locking.lockwarden.io" && (h.NamespaceSelector == nil || len(h.NamespaceSelector.MatchExpressions) == 0) {
				cfg.Webhooks[i].NamespaceSelector = exempt
			}
		}
		return env.c.Update(t.Context(), cfg)
	})
	if err != nil {
		t.Fatalf("exempting the manager's namespace from the previous release's guard-subresource webhook: %v", err)
	}
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "rollout", "status", "deployment/"+deployment, "--timeout=3m"))
	served(t)
	return time.Since(start)
}
