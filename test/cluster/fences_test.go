package cluster

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// acquireRelease takes resource in ns once and returns its fence.
func acquireRelease(t *testing.T, ns, resource string) int64 {
	t.Helper()
	h, err := lock.NewClient(env.c, lock.WithNamespace(ns)).Acquire(t.Context(), resource, lock.WithTTL(time.Minute), lock.WithWait(time.Minute))
	if err != nil {
		t.Fatalf("acquiring %s: %v", resource, err)
	}
	if err := h.Release(t.Context()); err != nil {
		t.Fatalf("releasing %s: %v", resource, err)
	}
	return h.Info().Fence
}

// testUninstallKeepsFences: `helm uninstall` keeps every FenceCounter, the
// cluster stays writable without the manager, and a reinstall continues
// the fences.
func testUninstallKeepsFences(t *testing.T) {
	ensureRelease(t)
	ns := namespace(t, "kept")
	h := guardedConfigMap(t, ns, "ledger", "ledger/kept")
	if err := h.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := acquireRelease(t, ns, "ledger/kept")

	helmUninstall(t)
	counter := &lockingv1alpha1.FenceCounter{}
	if err := env.c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName("ledger/kept")}, counter); err != nil {
		t.Fatalf("the FenceCounter after helm uninstall: %v", err)
	}
	if counter.Spec.Fence != before {
		t.Errorf("the FenceCounter after helm uninstall holds fence %d, want %d", counter.Spec.Fence, before)
	}
	// Nothing lockwarden installed blocks a write any more, the guarded
	// object's included.
	if err := env.c.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unguarded"}}); err != nil {
		t.Errorf("a write with lockwarden uninstalled: %v", err)
	}
	cm := &corev1.ConfigMap{}
	if err := env.c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "ledger"}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["note"] = "written while lockwarden is uninstalled"
	if err := env.c.Update(t.Context(), cm); err != nil {
		t.Errorf("a write to a guarded object with lockwarden uninstalled: %v", err)
	}

	record(t, "helm reinstall -> Ready and served", helmInstall(t, *image), installTarget)
	if after := acquireRelease(t, ns, "ledger/kept"); after <= before {
		t.Errorf("after the reinstall the resource's fence is %d, not above %d", after, before)
	}
}

// testWebhookSecretDeleted deletes the manager's webhook certificate Secret
// and restarts every manager Pod: the manager recovers by itself.
func testWebhookSecretDeleted(t *testing.T) {
	ensureRelease(t)
	start := time.Now()
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "delete", "secret", webhookSecret))
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "delete", "pods", "-l", "control-plane=controller-manager", "--wait=false"))
	eventually(t, "the manager is Ready again", 3*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := kubectl(ctx, "-n", releaseNamespace, "rollout", "status", "deployment/"+deployment, "--timeout=5s")
		return err == nil, err
	})
	served(t)
	record(t, "webhook Secret deleted, Pods restarted -> Ready and served", time.Since(start), 2*recoverTarget)
}
