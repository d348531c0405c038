package main

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// grantObserver watches the LockGrants of a namespace as the admin: it
// records every phase the controller gives a grant on the timeline, and lets
// the demo wait for a grant to reach a state.
type grantObserver struct {
	c  client.WithWatch
	tl *timeline

	mu   sync.Mutex
	last map[string]*lockingv1alpha1.LockGrant // by name
	// changed is closed, and replaced, whenever last changes.
	changed chan struct{}
}

// watchGrants starts observing the LockGrants of ns until ctx ends.
func watchGrants(ctx context.Context, c client.WithWatch, ns string, tl *timeline) *grantObserver {
	o := &grantObserver{c: c, tl: tl, last: map[string]*lockingv1alpha1.LockGrant{}, changed: make(chan struct{})}
	go o.run(ctx, ns)
	return o
}

func (o *grantObserver) run(ctx context.Context, ns string) {
	for ctx.Err() == nil {
		// A watch without resourceVersion starts with every grant's current
		// state; phases already seen are not recorded twice.
		wi, err := o.c.Watch(ctx, &lockingv1alpha1.LockGrantList{}, client.InNamespace(ns))
		if err != nil {
			_ = sleep(ctx, time.Second)
			continue
		}
		o.consume(ctx, wi.ResultChan())
		wi.Stop()
	}
}

func (o *grantObserver) consume(ctx context.Context, events <-chan watch.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if g, ok := ev.Object.(*lockingv1alpha1.LockGrant); ok {
				o.observe(g)
			}
		}
	}
}

func (o *grantObserver) observe(g *lockingv1alpha1.LockGrant) {
	o.mu.Lock()
	prev := o.last[g.Name]
	o.last[g.Name] = g
	changed := o.changed
	o.changed = make(chan struct{})
	o.mu.Unlock()
	close(changed)
	if g.Status.Phase != "" && (prev == nil || prev.Status.Phase != g.Status.Phase) {
		o.tl.addGrant(g)
	}
}

// waitFor waits until the grant named name satisfies cond, and returns it.
func (o *grantObserver) waitFor(ctx context.Context, name string, cond func(*lockingv1alpha1.LockGrant) bool) (*lockingv1alpha1.LockGrant, error) {
	for {
		o.mu.Lock()
		g, changed := o.last[name], o.changed
		o.mu.Unlock()
		if g != nil && cond(g) {
			return g, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return g, ctx.Err()
		}
	}
}
