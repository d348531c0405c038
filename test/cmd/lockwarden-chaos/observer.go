package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// observer watches, as the admin and around the fault proxies, every
// LockGrant and every version of every guarded ConfigMap in the chaos
// namespace, and the manager's leader Lease, and records what it sees. Each
// watch resumes from the last resourceVersion it saw, so it sees every
// version in order; if it cannot (410 Gone), it records a gap.
type observer struct {
	c   client.WithWatch
	rec *recorder
	wg  sync.WaitGroup

	mu sync.Mutex
	// heldBy maps a Held grant's name to its owner's worker name.
	heldBy map[string]string
	leader string
	// leaderChanged is closed, and replaced, when the leader changes.
	leaderChanged chan struct{}
	// seen maps "kind/name" to the last resourceVersion seen; seenChanged
	// is closed, and replaced, when it changes.
	seen        map[string]string
	seenChanged chan struct{}
}

// startObserver starts the watches; they run until ctx ends.
func startObserver(ctx context.Context, c client.WithWatch, rec *recorder) *observer {
	o := &observer{
		c: c, rec: rec, heldBy: map[string]string{}, leaderChanged: make(chan struct{}),
		seen: map[string]string{}, seenChanged: make(chan struct{}),
	}
	o.follow(ctx, &lockingv1alpha1.LockGrantList{}, &client.ListOptions{Namespace: chaosNamespace}, o.grant)
	o.follow(ctx, &corev1.ConfigMapList{}, &client.ListOptions{
		Namespace:     chaosNamespace,
		LabelSelector: labels.SelectorFromSet(labels.Set{lockingv1alpha1.GuardedLabel: "true"}),
	}, o.version)
	o.follow(ctx, &coordinationv1.LeaseList{}, &client.ListOptions{
		Namespace:     localcp.SystemNamespace,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", leaderElectionID),
	}, o.lease)
	return o
}

// wait waits for the watches to end.
func (o *observer) wait() { o.wg.Wait() }

// follow lists, then watches from the list's resourceVersion, resuming
// from the last version seen whenever a watch ends.
func (o *observer) follow(ctx context.Context, list client.ObjectList, opts *client.ListOptions, handle func(runtime.Object)) {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		rv := ""
		for ctx.Err() == nil {
			if rv == "" {
				var err error
				if rv, err = o.list(ctx, list, opts, handle); err != nil {
					_ = sleep(ctx, 500*time.Millisecond)
					continue
				}
			}
			wopts := *opts
			wopts.Raw = &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}
			wi, err := o.c.Watch(ctx, list, &wopts)
			if err != nil {
				_ = sleep(ctx, 500*time.Millisecond)
				continue
			}
			for ev := range wi.ResultChan() {
				if ev.Type == watch.Error {
					if err := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
						o.rec.emit(Event{Kind: EventNote, Op: NoteGap, Detail: err.Error()})
						rv = ""
					}
					break
				}
				if m, err := meta.Accessor(ev.Object); err == nil && m.GetResourceVersion() != "" {
					rv = m.GetResourceVersion()
				}
				if ev.Type == watch.Added || ev.Type == watch.Modified {
					handle(ev.Object)
				}
			}
			wi.Stop()
		}
	}()
}

func (o *observer) list(ctx context.Context, list client.ObjectList, opts *client.ListOptions, handle func(runtime.Object)) (string, error) {
	if err := o.c.List(ctx, list, opts); err != nil {
		return "", err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return "", err
	}
	for _, it := range items {
		handle(it)
	}
	return list.(metav1.ListInterface).GetResourceVersion(), nil
}

// grantEvent describes a LockGrant for the history.
func grantEvent(g *lockingv1alpha1.LockGrant) Event {
	e := Event{
		Kind: EventNote, Op: NoteGrant, Resource: g.Spec.Resource, Grant: g.Name, UID: string(g.UID),
		Owner: g.Spec.Owner, Phase: string(g.Status.Phase), Fence: g.Status.FenceToken, Count: g.Spec.Renewals, RV: g.ResourceVersion,
		Created: timePtr(g.CreationTimestamp.Time),
	}
	st := g.Status
	if st.GrantedAt != nil {
		e.GrantedAt = timePtr(st.GrantedAt.Time)
	}
	if st.ExpiresAt != nil {
		e.ExpiresAt = timePtr(st.ExpiresAt.Time)
	}
	if st.EndedAt != nil {
		e.EndedAt = timePtr(st.EndedAt.Time)
	}
	return e
}

func (o *observer) grant(obj runtime.Object) {
	g, ok := obj.(*lockingv1alpha1.LockGrant)
	if !ok {
		return
	}
	o.rec.emit(grantEvent(g))
	o.mu.Lock()
	defer o.mu.Unlock()
	o.saw("LockGrant/"+g.Name, g.ResourceVersion)
	if g.Status.Phase == lockingv1alpha1.PhaseHeld {
		// By request ID ("worker-N-SEQ"), not owner: two workers share an
		// identity.
		o.heldBy[g.Name] = g.Spec.RequestID[:max(0, strings.LastIndex(g.Spec.RequestID, "-"))]
	} else {
		delete(o.heldBy, g.Name)
	}
}

// versionEvent describes a version of a guarded ConfigMap for the history.
func versionEvent(cm *corev1.ConfigMap, op string) Event {
	count, _ := strconv.ParseInt(cm.Data[countKey], 10, 64)
	fence, _ := fencing.ParseFence(cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation])
	return Event{
		Kind: EventNote, Op: op, Object: cm.Name, RV: cm.ResourceVersion,
		Resource: cm.Annotations[lockingv1alpha1.ResourceAnnotation],
		Grant:    grantName(cm.Annotations[lockingv1alpha1.AcceptedGrantAnnotation]), Fence: fence,
		Count: count, WriteID: cm.Data[writeKey],
	}
}

func (o *observer) version(obj runtime.Object) {
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		o.rec.emit(versionEvent(cm, NoteVersion))
		o.mu.Lock()
		defer o.mu.Unlock()
		o.saw("ConfigMap/"+cm.Name, cm.ResourceVersion)
	}
}

// saw records the last version seen of an object; o.mu is held.
func (o *observer) saw(key, rv string) {
	o.seen[key] = rv
	close(o.seenChanged)
	o.seenChanged = make(chan struct{})
}

// waitSeen waits until the observer has seen every object of want
// ("kind/name" -> resourceVersion) at that version, so that the history
// holds everything the final listing shows; it returns the keys still
// behind at the deadline.
func (o *observer) waitSeen(ctx context.Context, want map[string]string, timeout time.Duration) []string {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		o.mu.Lock()
		var behind []string
		for k, rv := range want {
			if o.seen[k] != rv {
				behind = append(behind, k)
			}
		}
		changed := o.seenChanged
		o.mu.Unlock()
		if len(behind) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return behind
		case <-ctx.Done():
			return behind
		}
	}
}

func (o *observer) lease(obj runtime.Object) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Spec.HolderIdentity == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if *l.Spec.HolderIdentity == o.leader {
		return
	}
	o.leader = *l.Spec.HolderIdentity
	o.rec.emit(Event{Kind: EventNote, Op: NoteLeader, Detail: o.leader})
	close(o.leaderChanged)
	o.leaderChanged = make(chan struct{})
}

// holders returns the workers that hold a grant now, as far as the observer
// has seen.
func (o *observer) holders() map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := map[string]bool{}
	for _, w := range o.heldBy {
		h[w] = true
	}
	return h
}

// currentLeader returns the Lease's holder and a channel closed when it
// changes.
func (o *observer) currentLeader() (string, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leader, o.leaderChanged
}

// grantName is the NAME of an accepted-grant record "NAMESPACE/NAME".
func grantName(record string) string {
	_, name, found := strings.Cut(record, "/")
	if !found {
		return record
	}
	return name
}
