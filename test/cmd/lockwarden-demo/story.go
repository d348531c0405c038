package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// What each worker writes.
const (
	resultAFirst = "A: first half of the batch"
	resultAStale = "A: stale total, computed before the pause"
	resultB      = "B: correct total"
)

// story plays the paused-holder story with two worker processes.
type story struct {
	admin client.WithWatch
	// self is the demo's own binary, re-executed for the workers.
	self string
	// kubeconfigs maps each actor to the kubeconfig of its identity.
	kubeconfigs map[string]string
	// dir is where worker logs go.
	dir string
	tl  *timeline
}

// outcome is what the story's verdict is made of.
type outcome struct {
	// lateWrite is A's report of its write after SIGCONT.
	lateWrite Event
	// bFence is the fence B wrote with.
	bFence int64
}

// play runs the story, prints the timeline and the final ConfigMap, and
// returns nil only if A's late write was refused with STALE_OWNER and the
// ConfigMap holds B's result.
func (s *story) play(ctx context.Context) error {
	out, err := s.run(ctx)
	s.tl.print(os.Stdout)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{}
	if err := s.admin.Get(ctx, client.ObjectKey{Namespace: billingNamespace, Name: storyConfigMap}, cm); err != nil {
		return fmt.Errorf("reading the final ConfigMap: %w", err)
	}
	printConfigMap(cm)
	return verdict(out, cm)
}

// run starts the workers and drives them with signals; both are stopped
// before it returns.
func (s *story) run(ctx context.Context) (outcome, error) {
	var out outcome
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.tl.start = time.Now()
	grants := watchGrants(ctx, s.admin, billingNamespace, s.tl)

	say("Worker A takes a %ds lease on %s and writes ConfigMap %s/%s", leaseSeconds, storyResource, billingNamespace, storyConfigMap)
	a, err := s.startWorker("A", "--result", resultAFirst, "--result", resultAStale, "--work", workDuration.String())
	if err != nil {
		return out, err
	}
	defer a.stop()
	aReq, err := a.await(ctx, EventRequested)
	if err != nil {
		return out, err
	}
	if _, err := a.await(ctx, EventComputing); err != nil {
		return out, err
	}
	if err := a.freeze(); err != nil {
		return out, fmt.Errorf("freezing worker A: %w", err)
	}
	frozenAt := time.Now()
	aGrant, err := grants.waitFor(ctx, aReq.Detail, func(g *lockingv1alpha1.LockGrant) bool { return g.Status.ExpiresAt != nil })
	if err != nil {
		return out, fmt.Errorf("reading A's grant: %w", err)
	}
	aFence := aGrant.Status.FenceToken
	s.tl.add(entry{at: frozenAt, actor: "A", fence: aFence, action: "FROZEN (SIGSTOP) in the middle of its work"})

	say("A is frozen, holding fence %d; waiting for its lease to run out (at %s)", aFence, s.tl.clock(aGrant.Status.ExpiresAt.Time))
	aExpiresAt := aGrant.Status.ExpiresAt.Time
	expCtx, expCancel := context.WithDeadline(ctx, aExpiresAt.Add(stepTimeout))
	aGrant, err = grants.waitFor(expCtx, aReq.Detail, func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase.Final() })
	expCancel()
	switch {
	case err != nil:
		return out, fmt.Errorf("waiting for the controller to expire A's grant %s (lease ended at %s): %w", aReq.Detail, s.tl.clock(aExpiresAt), err)
	case aGrant.Status.Phase != lockingv1alpha1.PhaseExpired:
		return out, fmt.Errorf("worker A's grant %s ended as %s, want Expired", aGrant.Name, aGrant.Status.Phase)
	case time.Now().Before(aGrant.Status.ExpiresAt.Time):
		return out, fmt.Errorf("worker A's grant %s is Expired before its expiresAt %s", aGrant.Name, aGrant.Status.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}

	say("A's lease is over while A is still frozen; worker B takes over")
	b, err := s.startWorker("B", "--result", resultB, "--release")
	if err != nil {
		return out, err
	}
	defer b.stop()
	bReq, err := b.await(ctx, EventRequested)
	if err != nil {
		return out, err
	}
	bWrite, err := b.await(ctx, EventWriteAccepted, EventWriteRejected)
	if err != nil {
		return out, err
	}
	if bWrite.Event != EventWriteAccepted {
		return out, fmt.Errorf("worker B's write with fence %d, the current holder's, was refused: %s", bWrite.Fence, bWrite.Detail)
	}
	out.bFence = bWrite.Fence
	if err := b.wait(ctx); err != nil {
		return out, err
	}
	endCtx, endCancel := context.WithTimeout(ctx, stepTimeout)
	_, err = grants.waitFor(endCtx, bReq.Detail, func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase.Final() })
	endCancel()
	if err != nil {
		return out, fmt.Errorf("waiting for the controller to end B's released grant %s: %w", bReq.Detail, err)
	}

	say("B is done; resuming A, which still believes it holds fence %d", aFence)
	if err := a.resume(); err != nil {
		return out, fmt.Errorf("resuming worker A: %w", err)
	}
	s.tl.add(entry{at: time.Now(), actor: "A", fence: aFence, action: "RESUMED (SIGCONT), writes the total it computed"})
	if out.lateWrite, err = a.await(ctx, EventWriteAccepted, EventWriteRejected); err != nil {
		return out, err
	}
	return out, a.wait(ctx)
}

func (s *story) startWorker(actor string, args ...string) (*workerProc, error) {
	args = append([]string{
		"--namespace", billingNamespace,
		"--resource", storyResource,
		"--configmap", storyConfigMap,
		"--ttl", strconv.Itoa(leaseSeconds),
	}, args...)
	return startWorker(s.self, actor, s.kubeconfigs[actor], filepath.Join(s.dir, "worker-"+actor+".log"), s.tl, args...)
}

// verdict checks the end state a user cares about.
func verdict(out outcome, cm *corev1.ConfigMap) error {
	late := out.lateWrite
	switch {
	case late.Event == EventWriteAccepted:
		return fmt.Errorf("worker A's late write with fence %d was ACCEPTED: the stale owner overwrote B's result", late.Fence)
	case late.Reason != string(fencing.ReasonStaleOwner):
		return fmt.Errorf("worker A's late write with fence %d was refused with %q, want %s", late.Fence, late.Detail, fencing.ReasonStaleOwner)
	}
	if got := cm.Data["result"]; got != resultB {
		return fmt.Errorf("the ConfigMap holds %q, want B's %q", got, resultB)
	}
	if got, want := cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation], fencing.FormatFence(out.bFence); got != want {
		return fmt.Errorf("the ConfigMap's accepted fence is %q, want B's fence %s", got, want)
	}
	return nil
}

func printConfigMap(cm *corev1.ConfigMap) {
	fmt.Printf("\nFinal ConfigMap %s/%s:\n  data:\n", cm.Namespace, cm.Name)
	for _, k := range sortedKeys(cm.Data) {
		fmt.Printf("    %s: %q\n", k, cm.Data[k])
	}
	fmt.Println("  annotations:")
	for _, k := range sortedKeys(cm.Annotations) {
		fmt.Printf("    %s: %q\n", k, cm.Annotations[k])
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// say narrates a step of the story as it happens.
func say(format string, args ...any) {
	fmt.Printf("    "+format+"\n", args...)
}
