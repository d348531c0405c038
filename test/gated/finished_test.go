package gated

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// stays checks that cond keeps holding for d: a lock that must not be
// given back yet.
func stays(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, d, true, func(context.Context) (bool, error) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
		return false, nil
	})
	if err != nil && t.Context().Err() != nil {
		t.Fatal(err)
	}
}

// terminated is the status of a container that exited with code.
func terminated(name string, code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Image: "registry.example/settle:1", ImageID: "registry.example/settle@sha256:1",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error"}}}
}

// Whoever may write Pods' status (a node, or a user given pods/status) can
// report a running Pod's containers terminated and so have the manager
// give its lock back while the container still runs. The fence is what
// protects the resource: the container's guarded writes under its fence
// are refused at once, before any other Pod holds the lock.
func TestContainersReportedEndedLoseTheirFenceAtOnce(t *testing.T) {
	ns := space(t)
	must(t, admin.Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-status"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "pods/status"}, Verbs: []string{"get", "update", "patch"}},
	}}))
	must(t, admin.Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-status"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-status"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}},
	}))
	mallory := as(t, "mallory")
	heartbeat(t, "node-a")
	holder := createPod(t, podSpec(ns, "holder", nil))
	s := waitStarted(t, holder)
	run(t, holder, "node-a")
	if err := write(t, s, "the holder's result"); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	var err error
	waitFor(t, "mallory may write the Pod's status", func() bool {
		cur := pod(t, holder)
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("settle", 0)}
		err = mallory.Status().Update(t.Context(), cur)
		return err == nil
	})
	waitGrant(t, holder, "Released", phase(lockingv1alpha1.PhaseReleased))
	if err := write(t, s, "a write after the lock was given back"); reason(err) != "ALREADY_ENDED" {
		t.Fatalf("the container's write after its grant was released: %v, want ALREADY_ENDED", err)
	}
}

// A sidecar whose exit restarts every container in place
// (restartPolicyRules: RestartAllContainers) can run the Pod's regular
// containers again after the kubelet reported them terminated: the Pod
// keeps its lock until its phase says it is over, and the next Pod waits.
func TestPodThatMayRestartItsContainersKeepsItsLockUntilItsPhase(t *testing.T) {
	ns := space(t)
	heartbeat(t, "node-a")
	spec := podSpec(ns, "holder", nil)
	spec.Spec.InitContainers = []corev1.Container{{Name: "watcher", Image: "registry.example/watcher:1",
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		RestartPolicyRules: []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestartAllContainers,
			ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{88}}}}}}
	holder := createPod(t, spec)
	next := createPod(t, podSpec(ns, "next", nil))
	waitStarted(t, holder)
	run(t, holder, "node-a")
	// The settle container fails, the watcher sees it and exits 88: the
	// kubelet restarts every container of the Pod in place.
	cur := pod(t, holder)
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{terminated("settle", 1)}
	w := terminated("watcher", 88)
	w.Image, w.ImageID = "registry.example/watcher:1", "registry.example/watcher@sha256:1"
	cur.Status.InitContainerStatuses = []corev1.ContainerStatus{w}
	must(t, admin.Status().Update(t.Context(), cur))
	stays(t, "the holder's grant Held, the next Pod gated", 2*time.Second, func() bool {
		g := waitGrant(t, holder, "read", func(*lockingv1alpha1.LockGrant) bool { return true })
		return g.Status.Phase == lockingv1alpha1.PhaseHeld && !g.Spec.Release && !started(pod(t, next))
	})
	// Once its phase says it is over, the lock passes on.
	setPhase(t, holder, corev1.PodFailed)
	waitGrant(t, holder, "Released", phase(lockingv1alpha1.PhaseReleased))
	waitStarted(t, next)
}

// Whoever may patch a running Pod can change the grant annotations the
// manager wrote when it started it, which looks like a gate removed by
// hand: the Pod is ended, but, like any Pod being deleted, it keeps its
// lease until it is gone, since its containers may run for their grace
// period; only then does the next Pod start.
func TestChangedGrantAnnotationsDoNotGiveTheLockBackWhileThePodMayRun(t *testing.T) {
	ns := space(t)
	must(t, admin.Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}},
	}}))
	must(t, admin.Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pods"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}},
	}))
	mallory := as(t, "mallory")
	heartbeat(t, "node-a")
	holder := createPod(t, podSpec(ns, "holder", nil))
	next := createPod(t, podSpec(ns, "next", nil))
	waitStarted(t, holder)
	run(t, holder, "node-a")
	body := []byte(`{"metadata":{"annotations":{"locking.lockwarden.io/grant-uid":"forged"}}}`)
	waitFor(t, "mallory may patch the Pod", func() bool {
		return mallory.Patch(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: holder.Name}},
			client.RawPatch(types.MergePatchType, body)) == nil
	})
	waitPod(t, holder, "being deleted", func(p *corev1.Pod) bool { return p != nil && p.DeletionTimestamp != nil })
	stays(t, "the holder's grant Held while it is being deleted, the next Pod gated", time.Second, func() bool {
		g := waitGrant(t, holder, "read", func(*lockingv1alpha1.LockGrant) bool { return true })
		return g.Status.Phase == lockingv1alpha1.PhaseHeld && !g.Spec.Release && !started(pod(t, next))
	})
	// The kubelet confirms the containers are gone.
	must(t, admin.Delete(t.Context(), pod(t, holder), client.GracePeriodSeconds(0)))
	waitGrant(t, holder, "Released", phase(lockingv1alpha1.PhaseReleased))
	waitStarted(t, next)
}
