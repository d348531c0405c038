package gated

import (
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// writes records, by the UID of the Pod they belong to, every version of
// the namespace's Pods and LockGrants the API server stores from now on.
type writes struct {
	mu    sync.Mutex
	byPod map[types.UID]int
	total int
}

func recordWrites(t *testing.T, ns string) *writes {
	t.Helper()
	w := &writes{byPod: map[types.UID]int{}}
	pods := watchFromNow(t, ns, &corev1.PodList{})
	grants := watchFromNow(t, ns, &lockingv1alpha1.LockGrantList{})
	t.Cleanup(pods.Stop)
	t.Cleanup(grants.Stop)
	count := func(uid types.UID) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.byPod[uid]++
		w.total++
	}
	go func() {
		for e := range pods.ResultChan() {
			if p, ok := e.Object.(*corev1.Pod); ok {
				count(p.UID)
			}
		}
	}()
	go func() {
		for e := range grants.ResultChan() {
			if g, ok := e.Object.(*lockingv1alpha1.LockGrant); ok {
				if len(g.OwnerReferences) > 0 {
					count(g.OwnerReferences[0].UID)
				}
			}
		}
	}()
	return w
}

// watchFromNow watches the objects of list's kind in ns from the version
// the API server has now: no event for what already exists.
func watchFromNow(t *testing.T, ns string, list client.ObjectList) watch.Interface {
	t.Helper()
	must(t, admin.List(t.Context(), list, client.InNamespace(ns)))
	w, err := admin.Watch(t.Context(), list, &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
	must(t, err)
	return w
}

func (w *writes) of(uid types.UID) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.byPod[uid]
}

// A handoff between gated Pods writes the Pod that ends, the Pod that
// starts and the request that becomes next in line, never the other
// waiters: with 20 Pods waiting it costs the API server what it costs with
// 2, so 200 cost no more per handoff than 20.
func TestHandoffsDoNotRewriteWaiters(t *testing.T) {
	ns := space(t)
	const waiting, handoffs = 20, 3
	var pods []*corev1.Pod
	for i := range waiting + 1 {
		pods = append(pods, createPod(t, podSpec(ns, fmt.Sprintf("settle-%02d", i), nil)))
	}
	waitStarted(t, pods[0])
	for _, p := range pods[1:] {
		waitGrant(t, p, "queued", func(g *lockingv1alpha1.LockGrant) bool { return g.Status.QueuePosition != nil })
	}
	w := recordWrites(t, ns)
	for i := range handoffs {
		setPhase(t, pods[i], corev1.PodSucceeded)
		waitStarted(t, pods[i+1])
	}
	// The request behind the last one started is next in line.
	waitGrant(t, pods[handoffs+1], "next in line", func(g *lockingv1alpha1.LockGrant) bool {
		return g.Status.QueuePosition != nil && *g.Status.QueuePosition == 0
	})
	for i, p := range pods[handoffs+2:] {
		if n := w.of(p.UID); n > 0 {
			t.Errorf("waiter %d (%s) was written %d times during %d handoffs", i+handoffs+2, p.Name, n, handoffs)
		}
	}
	t.Logf("%d handoffs with %d waiting: %d writes of Pods and grants in all", handoffs, waiting, w.total)
}
