package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// testGatedDeletion deletes lock-gated Pods of one lock: a waiting one,
// whose request is withdrawn (its grant ends Released without a fence)
// while the holder and the waiter behind it are unaffected; then the
// holder, whose grant is released when it is gone, and the next waiter
// starts with a larger fence while the last one still waits.
func testGatedDeletion(t *testing.T) {
	ensureRelease(t)
	ns := gatedNamespace(t, "gated-deletion")
	o := observe(t, ns)
	const lock = "ledger/close"
	pause := corev1.Container{Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullNever}
	holder := gatedPod(t, ns, "holder", lock, "30s", pause)
	o.waitFact(t, "pod", holder.Name, factRunning, time.Minute)
	var waiters []*corev1.Pod
	for _, name := range []string{"waiter-1", "waiter-2", "waiter-3"} {
		waiters = append(waiters, gatedPod(t, ns, name, lock, "30s", pause))
	}
	eventually(t, "the three waiters' grants are Pending", time.Minute, func(context.Context) (bool, error) {
		for _, w := range waiters {
			g := o.grantOf(w)
			if g == nil || g.Status.Phase != lockingv1alpha1.PhasePending {
				return false, fmt.Errorf("waiter %s: grant %v", w.Name, g)
			}
		}
		return true, nil
	})
	held := o.grantOf(holder)
	if held == nil || held.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("the holder's grant is %+v, want Held", held)
	}

	// A waiter deleted: its request is withdrawn, nothing else changes.
	withdrawn := waiters[0]
	if err := env.c.Delete(t.Context(), withdrawn); err != nil {
		t.Fatal(err)
	}
	o.waitFact(t, "pod", withdrawn.Name, factGone, time.Minute)
	name := podGrantName(withdrawn)
	o.waitFact(t, "grant", name, string(lockingv1alpha1.PhaseReleased), time.Minute)
	for _, g := range o.grantVersions(name) {
		if g.Status.FenceToken != 0 || g.Status.Phase == lockingv1alpha1.PhaseHeld {
			t.Errorf("the deleted waiter's grant %s was %s with fence %d: it must end without one", name, g.Status.Phase, g.Status.FenceToken)
		}
	}
	o.waitFact(t, "grant", name, factGone, time.Minute) // the garbage collector, once released
	if err := env.c.Get(t.Context(), client.ObjectKeyFromObject(holder), holder); err != nil {
		t.Fatal(err)
	}
	for _, w := range waiters[1:] {
		if g := o.grantOf(w); g == nil || g.Status.Phase != lockingv1alpha1.PhasePending {
			t.Errorf("waiter %s's grant is %v after another waiter was deleted, want Pending", w.Name, g)
		}
		if _, ungated := o.at("pod", w.Name, factUngated); ungated {
			t.Errorf("waiter %s started while the holder holds", w.Name)
		}
	}
	if g := o.grantOf(holder); g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.FenceToken != held.Status.FenceToken {
		t.Errorf("the holder's grant is %s fence %d after a waiter was deleted, want Held fence %d", g.Status.Phase, g.Status.FenceToken, held.Status.FenceToken)
	}

	// The holder deleted: released once gone; the next waiter starts.
	deleted := time.Now()
	if err := env.c.Delete(t.Context(), holder); err != nil {
		t.Fatal(err)
	}
	next, last := waiters[1], waiters[2]
	running := o.waitFact(t, "pod", next.Name, factRunning, time.Minute)
	record(t, "gated holder deleted -> next Pod running", running.Sub(deleted), 0)
	gone, _ := o.at("pod", holder.Name, factGone)
	released, ok := o.at("grant", held.Name, string(lockingv1alpha1.PhaseReleased))
	if !ok {
		t.Fatalf("the deleted holder's grant is %s, want Released", o.grantOf(holder).Status.Phase)
	}
	t.Logf("holder deleted; gone +%.2fs, its grant Released +%.2fs, the next Pod running +%.2fs",
		gone.Sub(deleted).Seconds(), released.Sub(deleted).Seconds(), running.Sub(deleted).Seconds())
	if _, expired := o.at("grant", held.Name, string(lockingv1alpha1.PhaseExpired)); expired {
		t.Errorf("the deleted holder's grant expired instead of being released")
	}
	g := o.grantOf(next)
	if g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.FenceToken <= held.Status.FenceToken {
		t.Errorf("the next waiter's grant is %s fence %d, want Held above %d", g.Status.Phase, g.Status.FenceToken, held.Status.FenceToken)
	}
	if p := o.pod(next.Name); p.Annotations[lockingv1alpha1.FenceAnnotation] != fmt.Sprint(g.Status.FenceToken) {
		t.Errorf("the next Pod started with fence %q, its grant holds %d", p.Annotations[lockingv1alpha1.FenceAnnotation], g.Status.FenceToken)
	}
	if _, ungated := o.at("pod", last.Name, factUngated); ungated {
		t.Errorf("the last waiter started while %s holds", next.Name)
	}
	if g := o.grantOf(last); g == nil || g.Status.Phase != lockingv1alpha1.PhasePending {
		t.Errorf("the last waiter's grant is %v, want Pending", g)
	}
}
