package main

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// watchLoop watches the objects of list's kind selected by opts until ctx
// ends, calling fn with every added or modified object and the time its
// event arrived. It returns once the first watch is established (so that no
// write made after it returns is missed); stopped is closed when it ends. A
// watch that closes is resumed from the last resourceVersion seen, or from
// scratch (every current object again) after an error.
func watchLoop(ctx context.Context, c client.WithWatch, list client.ObjectList, opts []client.ListOption,
	fn func(obj client.Object, at time.Time)) (stopped <-chan struct{}, err error) {
	open := func(rv string) (watch.Interface, error) {
		o := append([]client.ListOption{}, opts...)
		o = append(o, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		return c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), o...)
	}
	wi, err := open("")
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rv := ""
		for {
			for ev := range wi.ResultChan() {
				at := time.Now()
				switch ev.Type {
				case watch.Added, watch.Modified:
					obj := ev.Object.(client.Object)
					rv = obj.GetResourceVersion()
					fn(obj, at)
				case watch.Bookmark:
					if m, err := meta.Accessor(ev.Object); err == nil {
						rv = m.GetResourceVersion()
					}
				case watch.Error:
					rv = ""
				}
			}
			wi.Stop()
			for {
				if ctx.Err() != nil {
					return
				}
				if wi, err = open(rv); err == nil {
					break
				}
				rv = ""
				_ = sleep(ctx, 100*time.Millisecond)
			}
		}
	}()
	return done, nil
}
