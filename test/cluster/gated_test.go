package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// gatedNamespace creates a namespace whose ServiceAccount "worker" may
// acquire locks and write ConfigMaps, for lock-gated Pods.
func gatedNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := namespace(t, prefix)
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker"}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acquire"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch"}},
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
			},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-acquires"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "acquire"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "worker"}},
		},
	}
	for _, o := range objs {
		if err := env.c.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// gatedWorker is the container of a lock-gated worker Pod: the demo's
// worker in --gated mode, its grant from the downward API.
func gatedWorker(args ...string) corev1.Container {
	fieldRef := func(annotation string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + annotation + "']"}}
	}
	return corev1.Container{
		Name: "worker", Image: workerImage, ImagePullPolicy: corev1.PullNever,
		Args: append([]string{"worker", "--gated", "--kubeconfig", ""}, args...),
		Env: []corev1.EnvVar{
			{Name: "LOCKWARDEN_GRANT", ValueFrom: fieldRef(lockingv1alpha1.GrantAnnotation)},
			{Name: "LOCKWARDEN_FENCE", ValueFrom: fieldRef(lockingv1alpha1.FenceAnnotation)},
			{Name: "LOCKWARDEN_FENCED_RESOURCE", ValueFrom: fieldRef(lockingv1alpha1.FencedResourceAnnotation)},
		},
	}
}

// followWorker streams the report of the worker container of pod, line by
// line, from its log.
func followWorker(t *testing.T, pod *corev1.Pod, actor string) <-chan workerEvent {
	t.Helper()
	events := make(chan workerEvent, 64)
	go func() {
		defer close(events)
		logs, err := env.cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "worker", Follow: true}).Stream(t.Context())
		if err != nil {
			t.Errorf("worker %s's log: %v", actor, err)
			return
		}
		defer logs.Close()
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var ev workerEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event != "" {
				t.Logf("worker %s: %s", actor, sc.Text())
				events <- ev
			}
		}
	}()
	return events
}

// observer watches the Pods and LockGrants of a namespace and notes when
// the test first saw each fact of each object: its clock, not the
// objects' timestamps (whole seconds), times every step.
type observer struct {
	mu     sync.Mutex
	first  map[string]time.Time
	pods   map[string]*corev1.Pod
	grants map[string]*lockingv1alpha1.LockGrant
	// versions are every version of every grant seen, in order.
	versions []*lockingv1alpha1.LockGrant
}

// Facts the observer notes.
const (
	factCreated   = "created"
	factUngated   = "ungated"
	factScheduled = "scheduled"
	factRunning   = "running"
	factReady     = "ready"
	factNotReady  = "not-ready"   // not ready after it was ready
	factExited    = "exited"      // its first container terminated
	factDone      = "done"        // phase Succeeded or Failed
	factDeleting  = "deleting"    // deletionTimestamp set
	factGone      = "gone"        // deleted
	factHeld      = "Held"        // grant phases
	factReleased  = "Released"    //
	factExpired   = "Expired"     //
	factLockLost  = "LockLost"    // DisruptionTarget condition, reason LockLost
	factEvicted   = "evicted-api" // DisruptionTarget set by the eviction API
)

func observe(t *testing.T, ns string) *observer {
	t.Helper()
	o := &observer{first: map[string]time.Time{}, pods: map[string]*corev1.Pod{}, grants: map[string]*lockingv1alpha1.LockGrant{}}
	for _, list := range []client.ObjectList{&corev1.PodList{}, &lockingv1alpha1.LockGrantList{}} {
		w, err := env.c.Watch(t.Context(), list, client.InNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		go func() {
			for ev := range w.ResultChan() {
				o.note(ev)
			}
		}()
	}
	return o
}

func (o *observer) note(ev watch.Event) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	mark := func(kind, name, fact string) {
		k := kind + "/" + name + "/" + fact
		if _, ok := o.first[k]; !ok {
			o.first[k] = now
		}
	}
	switch obj := ev.Object.(type) {
	case *corev1.Pod:
		n := obj.Name
		o.pods[n] = obj
		mark("pod", n, factCreated)
		if ev.Type == watch.Deleted {
			mark("pod", n, factGone)
		}
		gated := false
		for _, g := range obj.Spec.SchedulingGates {
			gated = gated || g.Name == lockingv1alpha1.PodSchedulingGate
		}
		if !gated {
			mark("pod", n, factUngated)
		}
		if obj.Spec.NodeName != "" {
			mark("pod", n, factScheduled)
		}
		if obj.DeletionTimestamp != nil {
			mark("pod", n, factDeleting)
		}
		for _, cs := range obj.Status.ContainerStatuses {
			if cs.State.Running != nil {
				mark("pod", n, factRunning)
			}
			if cs.State.Terminated != nil {
				mark("pod", n, factExited)
			}
			if cs.Ready {
				mark("pod", n, factReady)
			} else if _, was := o.first["pod/"+n+"/"+factReady]; was && cs.State.Running != nil {
				mark("pod", n, factNotReady)
			}
		}
		if obj.Status.Phase == corev1.PodSucceeded || obj.Status.Phase == corev1.PodFailed {
			mark("pod", n, factDone)
		}
		for _, c := range obj.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				switch c.Reason {
				case "LockLost":
					mark("pod", n, factLockLost)
				case "EvictionByEvictionAPI":
					mark("pod", n, factEvicted)
				}
			}
		}
	case *lockingv1alpha1.LockGrant:
		o.grants[obj.Name] = obj
		o.versions = append(o.versions, obj)
		if obj.Status.Phase != "" {
			mark("grant", obj.Name, string(obj.Status.Phase))
		}
		if ev.Type == watch.Deleted {
			mark("grant", obj.Name, factGone)
		}
	}
}

// at returns when the fact about the object was first seen, and whether
// it was.
func (o *observer) at(kind, name, fact string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.first[kind+"/"+name+"/"+fact]
	return at, ok
}

// pod returns the last version of Pod name seen, or nil.
func (o *observer) pod(name string) *corev1.Pod {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pods[name]
}

// grantOf returns the last version seen of the grant requested for pod.
func (o *observer) grantOf(pod *corev1.Pod) *lockingv1alpha1.LockGrant {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.grants[podGrantName(pod)]
}

// grantVersions returns every version seen of grant name, in order.
func (o *observer) grantVersions(name string) []*lockingv1alpha1.LockGrant {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*lockingv1alpha1.LockGrant
	for _, g := range o.versions {
		if g.Name == name {
			out = append(out, g)
		}
	}
	return out
}

// describe says what the observer last saw of the object (and of a Pod's
// grant), for a failure's message.
func (o *observer) describe(kind, name string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if kind == "grant" {
		if g := o.grants[name]; g != nil {
			return fmt.Errorf("grant %s: %s fence %d, release %v", name, g.Status.Phase, g.Status.FenceToken, g.Spec.Release)
		}
		return fmt.Errorf("grant %s not seen", name)
	}
	p := o.pods[name]
	if p == nil {
		return fmt.Errorf("pod %s not seen", name)
	}
	var grant string
	if g := o.grants[podGrantName(p)]; g != nil {
		grant = fmt.Sprintf("%s fence %d", g.Status.Phase, g.Status.FenceToken)
	}
	return fmt.Errorf("pod %s: phase %s, gates %v, node %q, fence %q, conditions %+v, containers %+v; its grant: %s",
		name, p.Status.Phase, p.Spec.SchedulingGates, p.Spec.NodeName, p.Annotations[lockingv1alpha1.FenceAnnotation],
		p.Status.Conditions, p.Status.ContainerStatuses, grant)
}

// podGrantName is the name of the grant the manager requests for pod.
func podGrantName(pod *corev1.Pod) string {
	return lockingv1alpha1.GrantNameForRequest(lockingv1alpha1.PodRequestID(string(pod.UID)))
}

// waitFact waits until the observer has seen fact of the object.
func (o *observer) waitFact(t *testing.T, kind, name, fact string, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, fmt.Sprintf("%s %s is %s", kind, name, fact), timeout, func(context.Context) (bool, error) {
		var ok bool
		at, ok = o.at(kind, name, fact)
		return ok, o.describe(kind, name)
	})
	return at
}

// gatedPod creates a lock-gated Pod of lock in ns, running as the
// ServiceAccount worker.
func gatedPod(t *testing.T, ns, name, lock, ttl string, c corev1.Container) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{
			lockingv1alpha1.LockAnnotation: lock,
			lockingv1alpha1.TTLAnnotation:  ttl,
		}},
		Spec: podSpec(),
	}
	pod.Spec.ServiceAccountName = "worker"
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers = []corev1.Container{c}
	if err := env.c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}
