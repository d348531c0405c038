package main

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// status names the lock-gated Pod behind a holder and each waiter.
func TestStatusShowsGatedPods(t *testing.T) {
	const res = "invoice-batch/2026-07-19"
	forPod := func(g lockingv1alpha1.LockGrant, pod string) lockingv1alpha1.LockGrant {
		g.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: "pod-uid-" + g.UID, Controller: ptr.To(true)}}
		return g
	}
	grants := []lockingv1alpha1.LockGrant{
		forPod(grantAt("h", res, 1, 0, lockingv1alpha1.PhaseHeld, nil, 3), "settle-0"),
		forPod(grantAt("w", res, 2, 0, lockingv1alpha1.PhasePending, nil, 0), "settle-1"),
		grantAt("x", res, 3, 0, lockingv1alpha1.PhasePending, nil, 0),
	}
	st := statusOf("ns", res, grants, nil)
	if st.Holder == nil || st.Holder.Pod != "settle-0" || st.Queue[0].Pod != "settle-1" || st.Queue[1].Pod != "" {
		t.Fatalf("status %+v, queue %+v: want the holder's and the waiter's Pods", st.Holder, st.Queue)
	}
	var out bytes.Buffer
	printStatus(&app{streams: genericiooptions.IOStreams{Out: &out}}, st)
	for _, want := range []string{"Pod:", "settle-0", "POD", "settle-1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
}
