package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// acceptedWrite is one version of the guarded ConfigMap: the grant and
// fence admission accepted it under.
type acceptedWrite struct {
	grant string
	fence int64
}

// testGatedJob runs a lock-gated Job of parallelism 3 whose containers
// each write one guarded ConfigMap twice, 3 s apart, under the fence
// their Pod was given, and kills the kubelet and containerd and starts
// them again while the first Pod holds and the two others wait: the Job
// completes, its Pods run one at a time, every grant ends Released (the
// holder's 10 s lease is renewed through the restart, none expires), every
// write the guard accepted names the grant of the Pod that was running
// then, and the fences strictly increase from Pod to Pod.
func testGatedJob(t *testing.T) {
	ensureRelease(t)
	loadWorkerImage(t)
	ns := gatedNamespace(t, "gated-job")
	o := observe(t, ns)

	// Every version of the ConfigMap, from before the Job exists.
	const configMap = "settlement"
	w, err := env.c.Watch(t.Context(), &corev1.ConfigMapList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": configMap})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var writes []acceptedWrite
	collect := func() {
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				cm, isCM := ev.Object.(*corev1.ConfigMap)
				if !isCM || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					continue
				}
				fence, err := fencing.ParseFence(cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation])
				if err != nil {
					t.Errorf("version %s of the ConfigMap records no accepted fence: %v", cm.ResourceVersion, err)
					continue
				}
				writes = append(writes, acceptedWrite{cm.Annotations[lockingv1alpha1.AcceptedGrantAnnotation], fence})
			default:
				return
			}
		}
	}

	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settle"},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To[int32](3),
			Completions:    ptr.To[int32](3),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			BackoffLimit:   ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
					lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19",
					lockingv1alpha1.TTLAnnotation:  "10s",
				}},
				Spec: corev1.PodSpec{
					ServiceAccountName:            "worker",
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{gatedWorker("--actor", "$(JOB_COMPLETION_INDEX)", "--namespace", ns,
						"--configmap", configMap, "--result", "first half", "--result", "total", "--work", "3s")},
				},
			},
		},
	}
	start := time.Now()
	if err := env.c.Create(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Pod of the Job holds and runs", time.Minute, func(context.Context) (bool, error) {
		collect()
		var pods corev1.PodList
		if err := env.c.List(t.Context(), &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if _, ok := o.at("pod", p.Name, factRunning); ok {
				return len(pods.Items) == 3, fmt.Errorf("%d Pods", len(pods.Items))
			}
		}
		return false, nil
	})
	restart := time.Now()
	must(t)(run(t.Context(), filepath.Join(env.root, "hack", "cluster", "cluster.sh"), "restart-node"))
	t.Logf("kubelet and containerd killed while a gated Pod held and two waited -> node Ready: %.1fs", time.Since(restart).Seconds())
	eventually(t, "the lock-gated Job completes", 3*time.Minute, func(ctx context.Context) (bool, error) {
		collect()
		if err := env.c.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err
		}
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				t.Fatalf("the Job failed: %s: %s", c.Reason, c.Message)
			}
		}
		return job.Status.Succeeded == 3, fmt.Errorf("%d of 3 Pods succeeded, %d active", job.Status.Succeeded, job.Status.Active)
	})
	record(t, "lock-gated Job of 3 Pods created -> complete", time.Since(start), 0)
	eventually(t, "the Job's three grants are released", 30*time.Second, func(context.Context) (bool, error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		for name, g := range o.grants {
			if g.Status.Phase.Final() && (g.Status.Phase != lockingv1alpha1.PhaseReleased || g.Status.FenceToken == 0) {
				t.Fatalf("grant %s of the Job ended %s with fence %d, want Released with one: no lease may end through the restart", name, g.Status.Phase, g.Status.FenceToken)
			}
			if g.Status.Phase != lockingv1alpha1.PhaseReleased {
				return false, fmt.Errorf("grant %s is %s", name, g.Status.Phase)
			}
		}
		return len(o.grants) == 3, fmt.Errorf("%d grants", len(o.grants))
	})
	eventually(t, "the ConfigMap's six accepted writes are seen", 30*time.Second, func(context.Context) (bool, error) {
		collect()
		return len(writes) >= 6, fmt.Errorf("%d versions seen", len(writes))
	})

	// Each Pod's grant and fence, and when its container ran.
	var pods corev1.PodList
	if err := env.c.List(t.Context(), &pods, client.InNamespace(ns), client.MatchingLabels{"batch.kubernetes.io/job-name": job.Name}); err != nil {
		t.Fatal(err)
	}
	type run struct {
		pod, grant    string
		fence         int64
		started, done time.Time
	}
	var runs []run
	for _, p := range pods.Items {
		fence, err := fencing.ParseFence(p.Annotations[lockingv1alpha1.FenceAnnotation])
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Terminated == nil {
			t.Fatalf("Pod %s: fence %q (%v), status %+v", p.Name, p.Annotations[lockingv1alpha1.FenceAnnotation], err, p.Status.ContainerStatuses)
		}
		term := p.Status.ContainerStatuses[0].State.Terminated
		runs = append(runs, run{p.Name, p.Annotations[lockingv1alpha1.GrantAnnotation], fence, term.StartedAt.Time, term.FinishedAt.Time})
	}
	if len(runs) != 3 {
		t.Fatalf("the Job ran %d Pods, want 3", len(runs))
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].fence < runs[j].fence })
	for i, r := range runs {
		t.Logf("Pod %s: grant %s, fence %d, ran %s to %s", r.pod, r.grant, r.fence, r.started.Format("15:04:05"), r.done.Format("15:04:05"))
		if i > 0 {
			if r.fence <= runs[i-1].fence {
				t.Errorf("Pod %s has fence %d, not above %d of the Pod before", r.pod, r.fence, runs[i-1].fence)
			}
			// Container times have whole-second resolution.
			if r.started.Before(runs[i-1].done) {
				t.Errorf("Pod %s started at %s, before Pod %s (fence %d) ended at %s", r.pod, r.started, runs[i-1].pod, runs[i-1].fence, runs[i-1].done)
			}
		}
	}

	// Every accepted write names the grant of a Pod of the Job with its
	// fence, the holders' writes come in their order, one Pod after the
	// other, and each Pod's two writes were accepted.
	// The guard records the grant as NAMESPACE/NAME.
	fenceOf := map[string]int64{}
	for i := range runs {
		runs[i].grant = ns + "/" + runs[i].grant
		fenceOf[runs[i].grant] = runs[i].fence
	}
	perGrant := map[string]int{}
	for i, wr := range writes {
		if f, ok := fenceOf[wr.grant]; !ok || f != wr.fence {
			t.Errorf("accepted write %d names grant %q with fence %d, which no Pod of the Job held", i, wr.grant, wr.fence)
		}
		if i > 0 && wr.fence < writes[i-1].fence {
			t.Errorf("accepted write %d has fence %d, below %d of the write before", i, wr.fence, writes[i-1].fence)
		}
		perGrant[wr.grant]++
	}
	for _, r := range runs {
		if perGrant[r.grant] != 2 {
			t.Errorf("Pod %s had %d of its 2 writes accepted", r.pod, perGrant[r.grant])
		}
	}
}
