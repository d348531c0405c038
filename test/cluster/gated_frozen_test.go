package cluster

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// testGatedFrozen freezes the container of the holding Pod of a lock-gated
// Job (its cgroup's freezer, as SIGSTOP through the runtime would) past
// its 6 s lease. Its readiness probe, answered by the worker process,
// fails, so the manager stops renewing: the grant expires, the next Pod is
// granted a larger fence and writes, and the manager marks the frozen Pod
// DisruptionTarget (LockLost) and deletes it (not an eviction). Thawed,
// the frozen worker gets its SIGTERM, finishes its unit of work as a
// graceful worker does, and its late write is refused STALE_OWNER; the
// Pod fails, the Job's podFailurePolicy ignores that failure, and the Job
// completes with a Pod in its place.
func testGatedFrozen(t *testing.T) {
	ensureRelease(t)
	loadWorkerImage(t)
	ns := gatedNamespace(t, "gated-frozen")
	o := observe(t, ns)
	const configMap = "settlement"
	worker := gatedWorker("--actor", "$(JOB_COMPLETION_INDEX)", "--namespace", ns, "--configmap", configMap,
		"--result", "first half", "--result", "total", "--work", "3s", "--ready-addr", ":8080", "--finish-on-term")
	worker.ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, TimeoutSeconds: 1, FailureThreshold: 2, SuccessThreshold: 1,
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settle"},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To[int32](2),
			Completions:    ptr.To[int32](2),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			BackoffLimit:   ptr.To[int32](0),
			// A lost lock is not the work's failure (docs/gated-workloads.md).
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
				Action:          batchv1.PodFailurePolicyActionIgnore,
				OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
			}}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
					lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19",
					lockingv1alpha1.TTLAnnotation:  "6s",
				}},
				Spec: corev1.PodSpec{
					ServiceAccountName: "worker",
					RestartPolicy:      corev1.RestartPolicyNever,
					// Long enough for the thawed worker to finish: the
					// kubelet's SIGKILL would come after it.
					TerminationGracePeriodSeconds: ptr.To[int64](60),
					Containers:                    []corev1.Container{worker},
				},
			},
		},
	}
	if err := env.c.Create(t.Context(), job); err != nil {
		t.Fatal(err)
	}

	// The first Pod granted: A.
	var a *corev1.Pod
	eventually(t, "a Pod of the Job is granted and runs", time.Minute, func(context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.c.List(t.Context(), &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if _, ok := o.at("pod", p.Name, factRunning); ok && p.Annotations[lockingv1alpha1.FenceAnnotation] != "" {
				a = p
				return true, nil
			}
		}
		return false, nil
	})
	t.Cleanup(func() { freezeQuietly(a) })
	aFence, err := fencing.ParseFence(a.Annotations[lockingv1alpha1.FenceAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	aEvents := followWorker(t, a, "A")
	if w := await(t, "A", aEvents, "write-accepted", "write-rejected"); w.Event != "write-accepted" {
		t.Fatalf("worker A's first write with fence %d was refused: %s", aFence, w.Detail)
	}
	o.waitFact(t, "pod", a.Name, factReady, 30*time.Second)
	freeze(t, a, true)
	frozenAt := time.Now()

	aGrant := podGrantName(a)
	notReady := o.waitFact(t, "pod", a.Name, factNotReady, time.Minute)
	expired := o.waitFact(t, "grant", aGrant, string(lockingv1alpha1.PhaseExpired), time.Minute)
	lost := o.waitFact(t, "pod", a.Name, factLockLost, time.Minute)
	deleting := o.waitFact(t, "pod", a.Name, factDeleting, time.Minute)
	if _, evicted := o.at("pod", a.Name, factEvicted); evicted {
		t.Errorf("the frozen Pod was evicted; the manager deletes it")
	}
	t.Logf("A frozen; not ready +%.1fs, its grant Expired +%.1fs, marked LockLost +%.1fs, deleted +%.1fs",
		notReady.Sub(frozenAt).Seconds(), expired.Sub(frozenAt).Seconds(), lost.Sub(frozenAt).Seconds(), deleting.Sub(frozenAt).Seconds())
	record(t, "gated Pod frozen -> its grant Expired (TTL 6s)", expired.Sub(frozenAt), 0)

	// The next Pod of the Job: B, with a larger fence, writes.
	var b *corev1.Pod
	eventually(t, "the next Pod of the Job is granted and runs", time.Minute, func(context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.c.List(t.Context(), &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if _, ok := o.at("pod", p.Name, factRunning); ok && p.Name != a.Name && p.Annotations[lockingv1alpha1.FenceAnnotation] != "" {
				b = p
				return true, nil
			}
		}
		return false, nil
	})
	bFence, err := fencing.ParseFence(b.Annotations[lockingv1alpha1.FenceAnnotation])
	if err != nil || bFence <= aFence {
		t.Fatalf("the next Pod %s has fence %q (%v), want above A's %d", b.Name, b.Annotations[lockingv1alpha1.FenceAnnotation], err, aFence)
	}
	bEvents := followWorker(t, b, "B")
	if w := await(t, "B", bEvents, "write-accepted", "write-rejected"); w.Event != "write-accepted" {
		t.Fatalf("worker B's write with fence %d, the holder's, was refused: %s", bFence, w.Detail)
	}

	// A thawed: its late write is refused STALE_OWNER.
	freeze(t, a, false)
	t.Logf("worker A was frozen for %.1fs", time.Since(frozenAt).Seconds())
	late := await(t, "A", aEvents, "write-accepted", "write-rejected")
	if late.Event != "write-rejected" || late.Reason != string(fencing.ReasonStaleOwner) {
		t.Fatalf("worker A's late write with fence %d: %s %s %s, want it refused %s", late.Fence, late.Event, late.Reason, late.Detail, fencing.ReasonStaleOwner)
	}
	o.waitFact(t, "pod", a.Name, factGone, time.Minute)

	eventually(t, "the Job completes", 2*time.Minute, func(ctx context.Context) (bool, error) {
		if err := env.c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err
		}
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				t.Fatalf("the Job failed: %s: %s", c.Reason, c.Message)
			}
		}
		return job.Status.Succeeded == 2, fmt.Errorf("%d of 2 Pods succeeded, %d active, %d failed", job.Status.Succeeded, job.Status.Active, job.Status.Failed)
	})

	// The fences of the grants that were Held strictly increase in the
	// order they were granted, and only A's expired.
	type held struct {
		name  string
		fence int64
		at    time.Time
	}
	var hs []held
	o.mu.Lock()
	for name, g := range o.grants {
		if at, ok := o.first["grant/"+name+"/"+string(lockingv1alpha1.PhaseHeld)]; ok {
			hs = append(hs, held{name, g.Status.FenceToken, at})
		}
		if _, ok := o.first["grant/"+name+"/"+string(lockingv1alpha1.PhaseExpired)]; ok && name != aGrant {
			t.Errorf("grant %s expired; only the frozen Pod's should", name)
		}
	}
	o.mu.Unlock()
	sort.Slice(hs, func(i, j int) bool { return hs[i].at.Before(hs[j].at) })
	if len(hs) != 3 {
		t.Errorf("%d grants were Held, want 3 (A, B, and the Pod in A's place)", len(hs))
	}
	for i := 1; i < len(hs); i++ {
		if hs[i].fence <= hs[i-1].fence {
			t.Errorf("grant %s Held fence %d after %s's %d", hs[i].name, hs[i].fence, hs[i-1].name, hs[i-1].fence)
		}
	}
	cm := &corev1.ConfigMap{}
	if err := env.c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: configMap}, cm); err != nil {
		t.Fatal(err)
	}
	if g := cm.Annotations[lockingv1alpha1.AcceptedGrantAnnotation]; g == ns+"/"+aGrant {
		t.Errorf("the ConfigMap's last accepted write is the frozen Pod's")
	}
}
