package gated

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

const lock = "invoice-batch/2026-07-19"

// space creates a namespace in which ServiceAccount "worker" may acquire
// locks and write ConfigMaps, ServiceAccount "stranger" exists but may
// not acquire, and user "alice" may create LockGrants.
func space(t *testing.T) string {
	t.Helper()
	ctx := t.Context()
	ns, err := env.Namespace(ctx, "gated")
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"worker", "stranger"} {
		must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}))
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acquire"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
	}}
	must(t, admin.Create(ctx, role))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acquire"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "acquire"},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "worker"},
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"},
		},
	}))
	return ns
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// as returns a client acting as user with groups.
func as(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	c := rest.CopyConfig(env.Config)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	cl, err := client.New(c, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// asServiceAccount returns a client acting as ServiceAccount sa of ns,
// with the groups the API server gives it.
func asServiceAccount(t *testing.T, ns, sa string) client.Client {
	t.Helper()
	owner := podgate.Owner(ns, sa)
	return as(t, owner, podgate.OwnerGroups(owner)...)
}

// podSpec is a Pod named name that runs as ServiceAccount worker and names
// the lock, with the given extra annotations.
func podSpec(ns, name string, annotations map[string]string) *corev1.Pod {
	a := map[string]string{lockingv1alpha1.LockAnnotation: lock}
	for k, v := range annotations {
		a[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: a},
		Spec: corev1.PodSpec{
			ServiceAccountName: "worker",
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "settle", Image: "registry.example/settle:1", Env: []corev1.EnvVar{{
				Name:      "LOCKWARDEN_FENCE",
				ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + lockingv1alpha1.FenceAnnotation + "']"}},
			}}}},
		},
	}
}

// createPod creates p as admin, one millisecond after the previous Pod by
// the shared clock, so that Pods are admitted in the order they are
// created. Like the controllers that create Pods, it tries again when the
// API server could not reach the webhook in time (a loaded test machine).
func createPod(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	clk.Step(time.Millisecond)
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		switch err := admin.Create(ctx, p); {
		case apierrors.IsInternalError(err) && strings.Contains(err.Error(), "failed calling webhook"):
			return false, nil
		case err != nil:
			return false, err
		}
		return true, nil
	})
	must(t, err)
	return p
}

// pod reads a Pod.
func pod(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	cur := &corev1.Pod{}
	must(t, admin.Get(t.Context(), client.ObjectKeyFromObject(p), cur))
	return cur
}

// waitPod polls the Pod until ok holds or a deadline passes; a Pod that is
// gone is passed as nil.
func waitPod(t *testing.T, p *corev1.Pod, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var cur *corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		cur = &corev1.Pod{}
		switch err := admin.Get(ctx, client.ObjectKeyFromObject(p), cur); {
		case apierrors.IsNotFound(err):
			cur = nil
		case err != nil:
			return false, err
		}
		return ok(cur), nil
	})
	if err != nil {
		var grants lockingv1alpha1.LockGrantList
		_ = admin.List(context.Background(), &grants, client.InNamespace(p.Namespace))
		for _, g := range grants.Items {
			t.Logf("grant %s of Pod %v: %s fence %d queue %v %v", g.Name, podgate.PodOf(&g), g.Status.Phase, g.Status.FenceToken, ptr.Deref(g.Status.QueuePosition, -1), g.Status.Conditions)
		}
		for _, e := range podEvents(t, p) {
			t.Logf("event %s: %s", e.Reason, e.Note)
		}
		t.Fatalf("Pod %s never %s (last %s): %v", p.Name, what, describe(cur), err)
	}
	return cur
}

func describe(p *corev1.Pod) string {
	if p == nil {
		return "gone"
	}
	return fmt.Sprintf("gates %v, phase %s, deleting %v, annotations %v", p.Spec.SchedulingGates, p.Status.Phase, p.DeletionTimestamp != nil, p.Annotations)
}

// started reports whether the Pod has lost its lock's scheduling gate.
func started(p *corev1.Pod) bool { return p != nil && !podgate.Gated(p) }

// waitStarted waits until the Pod's gate is removed.
func waitStarted(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	return waitPod(t, p, "started", started)
}

// grantName is the name of the grant of Pod p.
func grantName(p *corev1.Pod) string {
	return lockingv1alpha1.GrantNameForRequest(lockingv1alpha1.PodRequestID(string(p.UID)))
}

// waitGrant polls the grant of Pod p until ok holds.
func waitGrant(t *testing.T, p *corev1.Pod, what string, ok func(*lockingv1alpha1.LockGrant) bool) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		switch err := admin.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: grantName(p)}, cur); {
		case apierrors.IsNotFound(err):
			return false, nil
		case err != nil:
			return false, err
		}
		return ok(cur), nil
	})
	if err != nil {
		t.Fatalf("grant of Pod %s never %s (last %+v %+v): %v", p.Name, what, cur.Spec, cur.Status, err)
	}
	return cur
}

func phase(p lockingv1alpha1.LockGrantPhase) func(*lockingv1alpha1.LockGrant) bool {
	return func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase == p }
}

// bind binds the Pod to node, as the scheduler does.
func bind(t *testing.T, p *corev1.Pod, node string) {
	t.Helper()
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	must(t, admin.SubResource("binding").Create(t.Context(), pod(t, p), b))
}

// setPhase sets the Pod's status phase, as the kubelet does.
func setPhase(t *testing.T, p *corev1.Pod, ph corev1.PodPhase) {
	t.Helper()
	cur := pod(t, p)
	cur.Status.Phase = ph
	must(t, admin.Status().Update(t.Context(), cur))
}

// run plays the scheduler and the kubelet for a started Pod: bound to
// node, then Running.
func run(t *testing.T, p *corev1.Pod, node string) {
	t.Helper()
	bind(t, p, node)
	setPhase(t, p, corev1.PodRunning)
}

// heartbeat creates or renews node's Lease in kube-node-lease, as its
// kubelet does.
func heartbeat(t *testing.T, node string) {
	t.Helper()
	l := &coordinationv1.Lease{}
	key := types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: node}
	switch err := admin.Get(t.Context(), key, l); {
	case apierrors.IsNotFound(err):
		must(t, admin.Create(t.Context(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: time.Now()}},
		}))
	case err != nil:
		t.Fatal(err)
	default:
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		must(t, admin.Update(t.Context(), l))
	}
}

// touch changes the Pod's labels so that the controller reconciles it,
// as its RequeueAfter timer would once the fake clock passed a deadline.
func touch(t *testing.T, p *corev1.Pod) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"labels":{"test.lockwarden.io/touch":"%d"}}}`, time.Now().UnixNano())
	must(t, admin.Patch(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}, client.RawPatch(types.MergePatchType, []byte(body))))
}

// wakeGrant touches grant g so that the grant controller reconciles its
// resource, as its timer would.
func wakeGrant(t *testing.T, g *lockingv1alpha1.LockGrant) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"annotations":{"test.lockwarden.io/wake":"%d"}}}`, time.Now().UnixNano())
	must(t, admin.Patch(t.Context(), &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}, client.RawPatch(types.MergePatchType, []byte(body))))
}

// fenceOf is the fence annotation of a started Pod, as a number.
func fenceOf(t *testing.T, p *corev1.Pod) int64 {
	t.Helper()
	f, err := strconv.ParseInt(p.Annotations[lockingv1alpha1.FenceAnnotation], 10, 64)
	if err != nil {
		t.Fatalf("Pod %s has no fence: %v", p.Name, p.Annotations)
	}
	return f
}

// podEvents are the reasons of the Events about Pod p, oldest first.
func podEvents(t *testing.T, p *corev1.Pod) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	must(t, admin.List(t.Context(), &list, client.InNamespace(p.Namespace)))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Pod" && e.Regarding.Name == p.Name && e.Regarding.UID == p.UID {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].EventTime.Before(&out[j].EventTime) })
	return out
}

// waitEvent waits for an Event about Pod p with the given reason.
func waitEvent(t *testing.T, p *corev1.Pod, reason string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, e := range podEvents(t, p) {
			if e.Reason == reason {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		var reasons []string
		for _, e := range podEvents(t, p) {
			reasons = append(reasons, e.Reason+": "+e.Note)
		}
		t.Fatalf("Pod %s never had an Event %s (has %q)", p.Name, reason, reasons)
	}
	return found
}

// versions records every version of the Pods of a namespace that the API
// server stores, from a watch.
type versions struct {
	mu   sync.Mutex
	pods []corev1.Pod
}

// recordPods watches the Pods of ns until the test ends.
func recordPods(t *testing.T, ns string) *versions {
	t.Helper()
	w, err := admin.Watch(t.Context(), &corev1.PodList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	v := &versions{}
	t.Cleanup(w.Stop)
	go func() {
		for e := range w.ResultChan() {
			if p, ok := e.Object.(*corev1.Pod); ok {
				v.mu.Lock()
				v.pods = append(v.pods, *p)
				v.mu.Unlock()
			}
		}
	}()
	return v
}

func (v *versions) all() []corev1.Pod {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]corev1.Pod(nil), v.pods...)
}

// reason is the reason code of an admission denial, or "" for none.
func reason(err error) string { return string(denial.Reason(err)) }
