package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// startReplicas starts the replicas one after the other (the first creates
// the serving certificate, the next ones find it), waits until each is
// ready and admission answers through the balancer, and then until one of
// them leads.
func startReplicas(ctx context.Context, c client.Client, replicas []*replica) error {
	for _, r := range replicas {
		if err := r.start(); err != nil {
			return err
		}
		if err := r.waitReady(ctx, c); err != nil {
			return err
		}
	}
	return waitLeader(ctx, replicas)
}

// waitLeader waits until one of the replicas leads.
func waitLeader(ctx context.Context, replicas []*replica) error {
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, failoverTimeout, true, func(ctx context.Context) (bool, error) {
		for _, r := range replicas {
			if r.leader(ctx) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("no manager replica became leader within %s: %w", failoverTimeout, err)
	}
	return nil
}

// quiesce waits until every grant of the chaos namespace has ended, or
// until timeout; it returns the grants still live then.
func quiesce(ctx context.Context, c client.Client, timeout time.Duration) []string {
	var live []string
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var list lockingv1alpha1.LockGrantList
		if err := c.List(ctx, &list, client.InNamespace(chaosNamespace)); err != nil {
			return false, nil
		}
		live = live[:0]
		for _, g := range list.Items {
			if !g.Status.Phase.Final() {
				live = append(live, fmt.Sprintf("%s (%s, %s)", g.Name, g.Spec.Resource, g.Status.Phase))
			}
		}
		return len(live) == 0, nil
	})
	return live
}
