package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// pauseImage runs in every Pod the suite starts but the workers: the
// cluster's sandbox image, loaded from bin/pause.tar, never pulled.
const pauseImage = "registry.k8s.io/pause:3.10-lockwarden"

// namespace creates a namespace for one test, deleted at its end (the
// manager must run then: it judges the deletes of guarded objects).
func namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := env.c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the default service account of "+ns.Name+" exists", time.Minute, func(ctx context.Context) (bool, error) {
		err := env.c.Get(ctx, types.NamespacedName{Namespace: ns.Name, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, err
	})
	t.Cleanup(func() {
		_ = env.c.Delete(context.Background(), ns)
	})
	return ns.Name
}

// podSpec runs the pause image, never pulled.
func podSpec() corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers:                    []corev1.Container{{Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
	}
}

// scheduledPod creates an unguarded Pod in ns and waits until it is bound
// and running; it returns how long that took.
func scheduledPod(t *testing.T, ns, name string) time.Duration {
	t.Helper()
	start := time.Now()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: podSpec()}
	if err := env.c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Pod "+ns+"/"+name+" is scheduled and running", time.Minute, func(ctx context.Context) (bool, error) {
		if err := env.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err
		}
		return pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning, fmt.Errorf("node %q, phase %s, conditions %v", pod.Spec.NodeName, pod.Status.Phase, pod.Status.Conditions)
	})
	return time.Since(start)
}

// webDeployment creates an unguarded Deployment of n replicas labeled
// app=web in ns and waits until they are available.
func webDeployment(t *testing.T, ns string, n int32) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec()},
		},
	}
	if err := env.c.Create(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	waitAvailable(t, d, n)
	return d
}

func waitAvailable(t *testing.T, d *appsv1.Deployment, n int32) {
	t.Helper()
	eventually(t, fmt.Sprintf("Deployment %s/%s has %d available replicas", d.Namespace, d.Name, n), 2*time.Minute, func(ctx context.Context) (bool, error) {
		if err := env.c.Get(ctx, client.ObjectKeyFromObject(d), d); err != nil {
			return false, err
		}
		return d.Status.AvailableReplicas == n && d.Status.Replicas == n, fmt.Errorf("%d of %d available", d.Status.AvailableReplicas, d.Status.Replicas)
	})
}

// guardedConfigMap acquires resource in ns, writes a guarded ConfigMap
// under the grant's fence and returns the handle, still held.
func guardedConfigMap(t *testing.T, ns, name, resource string) *lock.Handle {
	t.Helper()
	h, err := lock.NewClient(env.c, lock.WithNamespace(ns)).Acquire(t.Context(), resource, lock.WithTTL(3*time.Minute), lock.WithWait(time.Minute))
	if err != nil {
		t.Fatalf("acquiring %s: %v", resource, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = h.Release(ctx)
	})
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{lockingv1alpha1.GuardedLabel: "true"},
			Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: resource}},
		Data: map[string]string{"state": "written under fence"},
	}
	if err := h.Stamp(cm); err != nil {
		t.Fatal(err)
	}
	if err := env.c.Create(t.Context(), cm); err != nil {
		t.Fatalf("writing the guarded ConfigMap: %v", err)
	}
	return h
}

// testOutage stops every manager replica and checks what the rest of the
// cluster gets meanwhile, then deletes every manager Pod and checks that
// the manager comes back by itself.
func testOutage(t *testing.T) {
	ensureRelease(t)
	ns := namespace(t, "outage")
	web := webDeployment(t, ns, 1)
	h := guardedConfigMap(t, ns, "ledger", "ledger/outage")
	node := env.vars["NODE"]

	// No replica runs: the Deployment is scaled to zero. kubectl scale is
	// itself a scale request, of an object in the manager's own namespace.
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "scale", "deployment/"+deployment, "--replicas=0"))
	eventually(t, "no manager Pod is left", 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := env.c.List(ctx, &pods, client.InNamespace(releaseNamespace), managerPods)
		return err == nil && len(pods.Items) == 0, err
	})
	down := time.Now()
	record(t, "unguarded Pod scheduled while the manager is down", scheduledPod(t, ns, "probe"), 30*time.Second)
	must(t)(kubectl(t.Context(), "-n", ns, "scale", "deployment/web", "--replicas=3"))
	waitAvailable(t, web, 3)
	must(t)(kubectl(t.Context(), "drain", node, "--pod-selector=app=web", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=90s"))
	must(t)(kubectl(t.Context(), "uncordon", node))
	waitAvailable(t, web, 3)
	record(t, "scale, drain of unguarded workloads while down", time.Since(down), 0)

	// Guarded objects stay unwritable: their webhooks fail closed.
	cm := &corev1.ConfigMap{}
	if err := env.c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "ledger"}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["state"] = "written while the manager is down"
	if err := h.Stamp(cm); err != nil {
		t.Fatal(err)
	}
	if err := env.c.Update(t.Context(), cm); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Errorf("a guarded write while the manager is down: got %v, want it refused because the webhook is unreachable", err)
	}

	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "scale", "deployment/"+deployment, "--replicas=2"))
	start := time.Now()
	served(t)
	record(t, "manager scaled 0 -> 2 -> Ready and served", time.Since(start), recoverTarget)

	// Every manager Pod deleted at once, as a node restart or two crashes
	// would: the ReplicaSet's new Pods are scheduled and Ready by
	// themselves, and other Pods are scheduled meanwhile.
	start = time.Now()
	must(t)(kubectl(t.Context(), "-n", releaseNamespace, "delete", "pods", "-l", "control-plane=controller-manager", "--wait=false"))
	scheduledPod(t, ns, "probe-2")
	eventually(t, "the deleted manager Pods are gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.c.List(ctx, &pods, client.InNamespace(releaseNamespace), managerPods); err != nil {
			return false, err
		}
		ready := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return false, nil
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == 2, fmt.Errorf("%d of %d manager Pods Ready", ready, len(pods.Items))
	})
	served(t)
	record(t, "all manager Pods deleted -> Ready and served", time.Since(start), recoverTarget)

	// The guarded object is writable again, under the same grant.
	if err := env.c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "ledger"}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["state"] = "written after the outage"
	if err := h.Stamp(cm); err != nil {
		t.Fatal(err)
	}
	if err := env.c.Update(t.Context(), cm); err != nil {
		t.Errorf("a fenced write after the outage: %v", err)
	}
	if err := h.Release(t.Context()); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("releasing: %v", err)
	}
}
