package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// acquire creates a LockGrant for resource, bound to operation root, and
// waits, watching it, until the controller reports it Held with a fence. A grant that ends before
// (timed out, released) is an error. The request ID makes a retried
// create find the same grant instead of queueing twice.
func acquire(ctx context.Context, c client.WithWatch, namespace, resource, root string, ttlSeconds int32) (*lockingv1alpha1.LockGrant, error) {
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	requestID := "settlement-" + hex.EncodeToString(id)
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: lockingv1alpha1.GrantNameForRequest(requestID)},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: ttlSeconds, RequestID: requestID, OperationRoot: root, OperationClass: "settlement"},
	}
	if err := c.Create(ctx, g); err != nil {
		return nil, fmt.Errorf("creating a LockGrant for %s: %w", resource, err)
	}
	for {
		// A watch without a resourceVersion starts with the grant's current
		// state, so nothing between Create and Watch is missed.
		w, err := c.Watch(ctx, &lockingv1alpha1.LockGrantList{}, client.InNamespace(namespace), client.MatchingFields{"metadata.name": g.Name})
		if err != nil {
			return nil, fmt.Errorf("watching LockGrant %s: %w", g.Name, err)
		}
		held, err := untilHeld(ctx, w)
		w.Stop()
		if held != nil || err != nil {
			return held, err
		}
	}
}

// untilHeld returns the grant once Held; nil, nil when the watch ended
// first.
func untilHeld(ctx context.Context, w watch.Interface) (*lockingv1alpha1.LockGrant, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the grant: %w", ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return nil, nil
			}
			if ev.Type == watch.Deleted {
				return nil, errors.New("the grant was deleted before it was held")
			}
			g, ok := ev.Object.(*lockingv1alpha1.LockGrant)
			switch {
			case !ok:
			case g.Status.Phase == lockingv1alpha1.PhaseHeld && g.Status.FenceToken > 0:
				return g, nil
			case g.Status.Phase.Final():
				return nil, fmt.Errorf("the grant ended %s before it was held", g.Status.Phase)
			}
		}
	}
}

// release asks the controller to end the grant (spec.release=true): this
// acquisition only. The update carries the resourceVersion of the grant
// read, and a name that now belongs to another acquisition (another UID)
// is left alone.
func release(ctx context.Context, c client.Client, g *lockingv1alpha1.LockGrant) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &lockingv1alpha1.LockGrant{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			return err
		}
		if cur.UID != g.UID || cur.Spec.Release || cur.Status.Phase.Final() {
			return nil
		}
		cur.Spec.Release = true
		return c.Update(ctx, cur)
	})
}

// reportTimeout bounds the regression report, which runs on the store's
// Apply goroutine.
const reportTimeout = 10 * time.Second

// reportRegression returns the store's regression hook. When the database
// refuses a segment with FENCE_REGRESSION (the lock registry issued a fence
// the database had already accepted from another grant: it was restored
// from an old snapshot), the worker reports it on its own grant, in the
// annotation locking.lockwarden.io/fence-regression. The controller then
// raises the grant's FenceRegression condition, a Warning Event and the
// metric lockwarden_grant_transitions_total{reason="FENCE_REGRESSION"},
// where operators look. The store has already recorded the alarm in
// lockwarden_fence_alarms; a failed report is printed, not retried.
func reportRegression(c client.Client, g *lockingv1alpha1.LockGrant, out io.Writer) func(context.Context, *postgres.Refusal) {
	return func(ctx context.Context, r *postgres.Refusal) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
		defer cancel()
		if err := annotateRegression(ctx, c, g, r.Error()); err != nil {
			fmt.Fprintf(out, "could not report FENCE_REGRESSION on %s/%s: %v\n", g.Namespace, g.Name, err)
			return
		}
		fmt.Fprintf(out, "reported FENCE_REGRESSION on %s/%s\n", g.Namespace, g.Name)
	}
}

// annotateRegression sets the fence-regression annotation on grant g, by a
// merge patch whose UID is a precondition: it can only reach this
// acquisition, never a later grant of the same name.
func annotateRegression(ctx context.Context, c client.Client, g *lockingv1alpha1.LockGrant, msg string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         g.UID,
		"annotations": map[string]string{lockingv1alpha1.FenceRegressionAnnotation: msg},
	}})
	if err != nil {
		return err
	}
	target := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}
	return c.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch))
}
