package podgate

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
)

// A replica whose Pod cache already shows the Pod another replica started
// (ungated, with its grant's fence) while its grant cache still shows the
// grant Pending must not take it for a gate removed by hand: it confirms
// with the API server before ending the Pod, and leaves it running.
func TestPodCacheAheadOfGrantCacheDoesNotEndAStartedPod(t *testing.T) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	now := time.Date(2026, 7, 19, 0, 0, 1, 0, time.UTC)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "settle-0", UID: types.UID("u1"),
			Annotations: map[string]string{lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19", lockingv1alpha1.RequestedAtAnnotation: "2026-07-19T00:00:00Z"}},
		Spec: corev1.PodSpec{ServiceAccountName: "worker", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "settle", Image: "settle"}}},
	}
	pending := podgate.GrantFor(pod, podgate.Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30})
	pending.UID = "g1"
	pending.Status.Phase = lockingv1alpha1.PhasePending
	held := pending.DeepCopy()
	held.Status.Phase, held.Status.FenceToken = lockingv1alpha1.PhaseHeld, 3
	held.Status.GrantedAt = &metav1.MicroTime{Time: now}
	held.Status.ExpiresAt = &metav1.MicroTime{Time: now.Add(30 * time.Second)}
	started := pod.DeepCopy()
	for k, v := range podgate.StartAnnotations(held) {
		started.Annotations[k] = v
	}

	index := func(o client.Object) []string {
		if ref := podgate.PodOf(o.(*lockingv1alpha1.LockGrant)); ref != nil {
			return []string{ref.Name}
		}
		return nil
	}
	// The API server: the Pod started, its grant Held (a later version).
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(started.DeepCopy(), pending.DeepCopy()).
		WithIndex(&lockingv1alpha1.LockGrant{}, PodField, index).Build()
	cur := &lockingv1alpha1.LockGrant{}
	if err := api.Get(t.Context(), client.ObjectKeyFromObject(pending), cur); err != nil {
		t.Fatal(err)
	}
	cur.Status = held.Status
	if err := api.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	// This replica's caches: the Pod as started, the grant as Pending.
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(started.DeepCopy(), pending.DeepCopy()).
		WithIndex(&lockingv1alpha1.LockGrant{}, PodField, index).Build()

	r := &Reconciler{Client: cache, Pods: cache, APIReader: api, Clock: clocktesting.NewFakePassiveClock(now)}
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pod)}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{}
	if err := cache.Get(t.Context(), client.ObjectKeyFromObject(pod), p); err != nil {
		t.Fatalf("the started Pod was deleted: %v", err)
	}
	g := &lockingv1alpha1.LockGrant{}
	if err := cache.Get(t.Context(), client.ObjectKeyFromObject(pending), g); err != nil {
		t.Fatal(err)
	}
	if g.Spec.Release {
		t.Fatalf("the started Pod's grant was released")
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			t.Fatalf("the started Pod was marked %s: %s", c.Reason, c.Message)
		}
	}
}

// A replica whose Pod cache still shows an earlier Pod of the same name
// (being deleted; a StatefulSet's Pod is recreated under its name) while
// its grant cache already shows the grant of the Pod that replaced it,
// Held and started by another replica, must not take that grant for one
// of a Pod that is gone: it confirms with the API server before
// releasing it, and the running Pod keeps its lock.
func TestPodCacheBehindDoesNotReleaseTheGrantOfThePodThatReplacedIt(t *testing.T) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	now := time.Date(2026, 7, 19, 0, 0, 1, 0, time.UTC)

	spec := corev1.PodSpec{ServiceAccountName: "worker", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "settle", Image: "settle"}}}
	annotations := func() map[string]string {
		return map[string]string{lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19", lockingv1alpha1.RequestedAtAnnotation: "2026-07-19T00:00:00Z"}
	}
	earlier := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "db-0", UID: types.UID("u1"), Annotations: annotations(),
		DeletionTimestamp: &metav1.Time{Time: now}, Finalizers: []string{"test.lockwarden.io/keep"}}, Spec: spec}
	later := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "db-0", UID: types.UID("u2"), Annotations: annotations()}, Spec: spec}
	request := podgate.Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30}
	ended := podgate.GrantFor(earlier, request)
	ended.UID = "g1"
	ended.Spec.Release = true
	ended.Status.Phase, ended.Status.FenceToken = lockingv1alpha1.PhaseReleased, 3
	held := podgate.GrantFor(later, request)
	held.UID = "g2"
	held.Status.Phase, held.Status.FenceToken = lockingv1alpha1.PhaseHeld, 4
	held.Status.GrantedAt = &metav1.MicroTime{Time: now}
	held.Status.ExpiresAt = &metav1.MicroTime{Time: now.Add(30 * time.Second)}
	started := later.DeepCopy()
	for k, v := range podgate.StartAnnotations(held) {
		started.Annotations[k] = v
	}

	index := func(o client.Object) []string {
		if ref := podgate.PodOf(o.(*lockingv1alpha1.LockGrant)); ref != nil {
			return []string{ref.Name}
		}
		return nil
	}
	// The API server: the earlier Pod is gone, the later one started.
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(started.DeepCopy(), ended.DeepCopy(), held.DeepCopy()).
		WithIndex(&lockingv1alpha1.LockGrant{}, PodField, index).Build()
	// This replica's caches: the earlier Pod, being deleted; both grants.
	cache := fake.NewClientBuilder().WithScheme(scheme).WithObjects(earlier.DeepCopy(), ended.DeepCopy(), held.DeepCopy()).
		WithIndex(&lockingv1alpha1.LockGrant{}, PodField, index).Build()

	r := &Reconciler{Client: cache, Pods: cache, APIReader: api, Clock: clocktesting.NewFakePassiveClock(now)}
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(later)}); err != nil {
		t.Fatal(err)
	}
	g := &lockingv1alpha1.LockGrant{}
	if err := cache.Get(t.Context(), client.ObjectKeyFromObject(held), g); err != nil {
		t.Fatal(err)
	}
	if g.Spec.Release {
		t.Fatalf("the grant of the running Pod that replaced the earlier one was released on a Pod cache behind")
	}
}
