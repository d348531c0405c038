package gated

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
)

// jobPods creates an indexed Job with parallelism n whose template names
// the lock, and its n Pods as the Job controller would: from the template,
// one per completion index, in index order, controlled by the Job.
func jobPods(t *testing.T, ns string, n int32, annotations map[string]string) []*corev1.Pod {
	t.Helper()
	tmpl := podSpec(ns, "", annotations)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settle-2026-07-19"},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(n), Completions: ptr.To(n), CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: tmpl.Annotations}, Spec: tmpl.Spec},
		},
	}
	must(t, admin.Create(t.Context(), job))
	var pods []*corev1.Pod
	for i := range n {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: fmt.Sprintf("%s-%d-x%d", job.Name, i, i),
				Labels:      job.Spec.Template.Labels,
				Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: strconv.Itoa(int(i))},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
					Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			},
			Spec: *job.Spec.Template.Spec.DeepCopy(),
		}
		for k, v := range job.Spec.Template.Annotations {
			p.Annotations[k] = v
		}
		pods = append(pods, createPod(t, p))
	}
	return pods
}

// The walkthrough's Job (docs/walkthrough.md): three Pods of one indexed
// Job with parallelism 3 run one at a time, in the order they were created,
// each under its own grant with a larger fence; each waits with an Event
// that says for whom.
func TestJobPodsRunOneAtATimeInOrder(t *testing.T) {
	ns := space(t)
	heartbeat(t, "node-a")
	pods := jobPods(t, ns, 3, map[string]string{lockingv1alpha1.TTLAnnotation: "30s"})

	var last int64
	for i, p := range pods {
		s := waitStarted(t, p)
		f := fenceOf(t, s)
		if f <= last {
			t.Fatalf("Pod %d started with fence %d, not above %d", i, f, last)
		}
		last = f
		for _, q := range pods[i+1:] {
			waitGrant(t, q, "Pending", phase(lockingv1alpha1.PhasePending))
			if started(pod(t, q)) {
				t.Fatalf("Pod %s started while Pod %s holds the lock", q.Name, p.Name)
			}
		}
		if i > 0 {
			if e := waitEvent(t, p, lockingv1alpha1.GatedPodReasonWaiting); !strings.Contains(e.Note, "waiting for lock "+lock) {
				t.Errorf("Pod %d's Event does not say what it waits for: %q", i, e.Note)
			}
		}
		run(t, p, "node-a")
		setPhase(t, p, corev1.PodSucceeded)
		waitGrant(t, p, "Released", phase(lockingv1alpha1.PhaseReleased))
	}
}

// A waiting Pod that is deleted withdraws its request: the Pod created
// after it is next.
func TestDeletedWaitingPodWithdrawsItsRequest(t *testing.T) {
	ns := space(t)
	holder := createPod(t, podSpec(ns, "holder", nil))
	f := fenceOf(t, waitStarted(t, holder))
	gone := createPod(t, podSpec(ns, "gone", nil))
	next := createPod(t, podSpec(ns, "next", nil))
	waitGrant(t, gone, "Pending", phase(lockingv1alpha1.PhasePending))
	if e := waitEvent(t, gone, lockingv1alpha1.GatedPodReasonWaiting); !strings.Contains(e.Note, fmt.Sprintf("held by Pod holder (fence %d)", f)) {
		t.Errorf("the waiting Pod's Event does not say who holds the lock: %q", e.Note)
	}

	must(t, admin.Delete(t.Context(), pod(t, gone)))
	g := waitGrant(t, gone, "withdrawn", phase(lockingv1alpha1.PhaseReleased))
	if g.Status.FenceToken != 0 {
		t.Fatalf("the withdrawn request was issued fence %d", g.Status.FenceToken)
	}
	setPhase(t, holder, corev1.PodFailed) // a failed Pod gives its lock back too
	waitStarted(t, next)
}

// A running Pod that is deleted gives its lock back once it is gone.
func TestDeletedRunningPodReleases(t *testing.T) {
	ns := space(t)
	heartbeat(t, "node-a")
	holder := createPod(t, podSpec(ns, "holder", nil))
	next := createPod(t, podSpec(ns, "next", nil))
	waitStarted(t, holder)
	run(t, holder, "node-a")
	must(t, admin.Delete(t.Context(), pod(t, holder), client.GracePeriodSeconds(0)))
	waitGrant(t, holder, "Released", phase(lockingv1alpha1.PhaseReleased))
	waitStarted(t, next)
}

// A Pod that restarts no container gives its lock back as soon as the
// kubelet reports every container terminated, before it writes the
// Pod's phase (which it does only once the sandbox is torn down).
func TestEndedContainersReleaseBeforeThePhase(t *testing.T) {
	ns := space(t)
	heartbeat(t, "node-a")
	holder := createPod(t, podSpec(ns, "holder", nil))
	next := createPod(t, podSpec(ns, "next", nil))
	waitStarted(t, holder)
	run(t, holder, "node-a")
	cur := pod(t, holder)
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "settle", Image: "registry.example/settle:1", ImageID: "registry.example/settle@sha256:1",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}}
	must(t, admin.Status().Update(t.Context(), cur))
	waitGrant(t, holder, "Released", phase(lockingv1alpha1.PhaseReleased))
	waitStarted(t, next)
	if p := pod(t, holder); p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the holder's phase is %s, want still Running", p.Status.Phase)
	}
}

// With permits: 2, two Pods run at once, each on its own slot with its own
// fence sequence; the third waits.
func TestPermitsRunNAtOnceOnTheirOwnSlots(t *testing.T) {
	ns := space(t)
	permits := map[string]string{lockingv1alpha1.PermitsAnnotation: "2"}
	a := createPod(t, podSpec(ns, "a", permits))
	b := createPod(t, podSpec(ns, "b", permits))
	c := createPod(t, podSpec(ns, "c", permits))
	slots := map[string]bool{}
	for _, p := range []*corev1.Pod{a, b} {
		s := waitStarted(t, p)
		slots[s.Annotations[lockingv1alpha1.FencedResourceAnnotation]] = true
	}
	if !slots[lock] || !slots[lockingv1alpha1.SlotResource(lock, 1)] {
		t.Fatalf("the two holders hold slots %v, want %s and %s", slots, lock, lockingv1alpha1.SlotResource(lock, 1))
	}
	waitGrant(t, c, "Pending", phase(lockingv1alpha1.PhasePending))
	if started(pod(t, c)) {
		t.Fatal("a third Pod started beside two holders of two permits")
	}
	setPhase(t, b, corev1.PodSucceeded)
	s := waitStarted(t, c)
	if got := s.Annotations[lockingv1alpha1.FencedResourceAnnotation]; got != pod(t, b).Annotations[lockingv1alpha1.FencedResourceAnnotation] {
		t.Fatalf("the third Pod holds %s, not the slot the second gave back", got)
	}
}

// Resource IDs are scoped to their namespace: a Pod of another namespace
// naming the same lock gets its own grant there, runs at once, and leaves
// the first namespace's grant as it was.
func TestOtherNamespacesNeverTouchTheGrant(t *testing.T) {
	nsA, nsB := space(t), space(t)
	a := createPod(t, podSpec(nsA, "settle", nil))
	waitStarted(t, a)
	before := waitGrant(t, a, "Held", phase(lockingv1alpha1.PhaseHeld))
	b := createPod(t, podSpec(nsB, "settle", nil))
	waitStarted(t, b)
	gb := waitGrant(t, b, "Held", phase(lockingv1alpha1.PhaseHeld))
	if gb.Namespace != nsB || gb.Spec.Owner != podgate.Owner(nsB, "worker") {
		t.Fatalf("the other namespace's Pod got grant %s/%s owned by %s", gb.Namespace, gb.Name, gb.Spec.Owner)
	}
	after := waitGrant(t, a, "Held", phase(lockingv1alpha1.PhaseHeld))
	if after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("the first namespace's grant changed: %+v -> %+v", before.Status, after.Status)
	}
}
