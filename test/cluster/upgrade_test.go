package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// testRollingUpgrade installs the chart with the previous release's image,
// starts holders and waiters, and upgrades to the image under test as the
// README says (helm upgrade --reuse-values --set image.tag=...): the
// replicas roll one at a time, no grant is lost, the fences continue, and
// the longest stall of the grant traffic is printed; then a rolling restart
// of the new release leaves no request undecided. The chart is this
// tree's in both: the previous release's own chart could not be installed
// reliably (its subresource webhook held up the binding of its own Pods).
func testRollingUpgrade(t *testing.T) {
	if *previousImage == "" {
		t.Fatal("-previous-image is required (make test-cluster builds it from PREVIOUS_REF)")
	}
	if installed(t.Context()) {
		helmUninstall(t)
	}
	adoptCRDs(t)
	record(t, "helm install (previous image) -> Ready and served", helmInstall(t, *previousImage), installTarget)
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
