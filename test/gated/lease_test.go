package gated

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// write makes a guarded write of ConfigMap "result" as the Pod's
// ServiceAccount, with the grant and fence the Pod carries: what a
// container does with the downward API.
func write(t *testing.T, p *corev1.Pod, data string) error {
	t.Helper()
	c := asServiceAccount(t, p.Namespace, p.Spec.ServiceAccountName)
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: p.Namespace, Name: "result"}
	err := c.Get(t.Context(), key, cm)
	claim := map[string]string{
		lockingv1alpha1.ResourceAnnotation: p.Annotations[lockingv1alpha1.FencedResourceAnnotation],
		lockingv1alpha1.GrantAnnotation:    p.Annotations[lockingv1alpha1.GrantAnnotation],
		lockingv1alpha1.FenceAnnotation:    p.Annotations[lockingv1alpha1.FenceAnnotation],
	}
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	if err != nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"}, Annotations: claim}, Data: map[string]string{"result": data}}
		return c.Create(t.Context(), cm)
	}
	for k, v := range claim {
		cm.Annotations[k] = v
	}
	cm.Data = map[string]string{"result": data}
	return c.Update(t.Context(), cm)
}

// A running Pod's grant is renewed while its node's heartbeat is live;
// once the node is lost, renewals stop, the grant expires, the Pod is
// deleted as disrupted, the next Pod starts, and the lost Pod's late write
// under its fence is refused.
func TestNodeLossEndsTheLeaseAndTheFenceRefusesLateWrites(t *testing.T) {
	ns := space(t)
	tl := clk.Now()
	at := func(s float64) { clk.SetTime(tl.Add(time.Duration(s * float64(time.Second)))) }
	heartbeat(t, "node-lost")
	lost := createPod(t, podSpec(ns, "lost", nil))
	next := createPod(t, podSpec(ns, "next", nil))
	s := waitStarted(t, lost)
	run(t, lost, "node-lost")
	if err := write(t, s, "lost's result"); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}

	// t=11: a third of the 30 s lease has passed; the node is live.
	at(11)
	touch(t, lost)
	waitGrant(t, lost, "renewed", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.ObservedRenewals == 1 })
	// t=35: due again; the kubelet stopped renewing the node's Lease at
	// t=0, which the manager first saw at t=11: live until t=52.
	at(35)
	touch(t, lost)
	g := waitGrant(t, lost, "renewed twice", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.ObservedRenewals == 2 })
	end := g.Status.ExpiresAt.Time
	// t=55: due again, and the heartbeat has lapsed: no renewal.
	at(55)
	touch(t, lost)
	waitEvent(t, lost, lockingv1alpha1.GatedPodReasonNodeLost)
	if got := waitGrant(t, lost, "Held", phase(lockingv1alpha1.PhaseHeld)); got.Spec.Renewals != 2 {
		t.Fatalf("the grant of a Pod on a lost node was renewed: renewals %d", got.Spec.Renewals)
	}
	// The lease ends; the grant controller's timer would notice.
	clk.SetTime(end.Add(time.Second))
	wakeGrant(t, g)
	waitGrant(t, lost, "Expired", phase(lockingv1alpha1.PhaseExpired))
	gone := waitPod(t, lost, "deleted", func(p *corev1.Pod) bool { return p == nil || p.DeletionTimestamp != nil })
	if gone != nil && !disrupted(gone, lockingv1alpha1.GatedPodReasonLockLost) {
		t.Errorf("the deleted Pod is not marked disrupted by the lost lock: %v", gone.Status.Conditions)
	}
	waitEvent(t, lost, lockingv1alpha1.GatedPodReasonLockLost)
	n := waitStarted(t, next)
	if fenceOf(t, n) <= fenceOf(t, s) {
		t.Fatalf("the next Pod's fence %d is not above the lost Pod's %d", fenceOf(t, n), fenceOf(t, s))
	}
	if err := write(t, n, "next's result"); err != nil {
		t.Fatalf("the next holder's write: %v", err)
	}
	if err := write(t, s, "lost's late result"); reason(err) != "STALE_OWNER" {
		t.Fatalf("the lost Pod's late write: %v, want STALE_OWNER", err)
	}
}

// disrupted reports whether the Pod carries a DisruptionTarget condition
// with reason.
func disrupted(p *corev1.Pod, reason string) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == reason {
			return true
		}
	}
	return false
}

// A forced release of a running Pod's grant ends the Pod.
func TestForcedReleaseEndsTheRunningPod(t *testing.T) {
	ns := space(t)
	heartbeat(t, "node-a")
	p := createPod(t, podSpec(ns, "forced", nil))
	waitStarted(t, p)
	run(t, p, "node-a")
	g := waitGrant(t, p, "Held", phase(lockingv1alpha1.PhaseHeld))
	must(t, admin.Delete(t.Context(), g))
	waitPod(t, p, "deleted", func(p *corev1.Pod) bool { return p == nil || p.DeletionTimestamp != nil })
	waitEvent(t, p, lockingv1alpha1.GatedPodReasonLockLost)
}

// A gate removed by someone else before the grant was Held ends the Pod
// and withdraws its request: a Pod that names a lock never runs without
// it.
func TestGateRemovedByHandEndsThePod(t *testing.T) {
	ns := space(t)
	holder := createPod(t, podSpec(ns, "holder", nil))
	waitStarted(t, holder)
	p := createPod(t, podSpec(ns, "impatient", nil))
	waitGrant(t, p, "Pending", phase(lockingv1alpha1.PhasePending))
	cur := pod(t, p)
	cur.Spec.SchedulingGates = nil
	must(t, admin.Update(t.Context(), cur))
	waitPod(t, p, "deleted", func(p *corev1.Pod) bool { return p == nil || p.DeletionTimestamp != nil })
	waitGrant(t, p, "withdrawn", phase(lockingv1alpha1.PhaseReleased))
}

// A started container whose readiness probe fails (stuck, frozen) stops
// the renewals: the grant ends at its lease's end, the Pod is deleted, and
// the next Pod starts.
func TestStuckContainerLosesItsLease(t *testing.T) {
	ns := space(t)
	tl := clk.Now()
	at := func(s float64) { clk.SetTime(tl.Add(time.Duration(s * float64(time.Second)))) }
	stuck := createPod(t, podSpec(ns, "stuck", nil))
	next := createPod(t, podSpec(ns, "next", nil))
	waitStarted(t, stuck)
	heartbeat(t, "node-stuck")
	run(t, stuck, "node-stuck")
	cur := pod(t, stuck)
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "settle", Image: "registry.example/settle:1", ImageID: "registry.example/settle@sha256:0",
		Started: ptr.To(true), Ready: false, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	must(t, admin.Status().Update(t.Context(), cur))

	at(11)
	heartbeat(t, "node-stuck") // the node is alive
	touch(t, stuck)
	waitEvent(t, stuck, lockingv1alpha1.GatedPodReasonNotReady)
	g := waitGrant(t, stuck, "Held", phase(lockingv1alpha1.PhaseHeld))
	if g.Spec.Renewals != 0 {
		t.Fatalf("the grant of a Pod whose container is not ready was renewed: renewals %d", g.Spec.Renewals)
	}
	clk.SetTime(g.Status.ExpiresAt.Add(time.Second))
	wakeGrant(t, g)
	waitPod(t, stuck, "deleted", func(p *corev1.Pod) bool { return p == nil || p.DeletionTimestamp != nil })
	waitStarted(t, next)
}
