package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// actorLabel selects the grants of one bench client, so that each client
// watches only its own.
const actorLabel = "bench.lockwarden.io/actor"

// lwClient is a lockwarden client: it acquires by creating a LockGrant,
// observes it through its own watch (label-selected), and releases with a
// merge patch carrying the grant's UID as a precondition (or, with
// releaseByDelete, by deleting the grant under that precondition). Like
// pkg/lock's handle of an exclusive lock, it also watches the FenceCounter
// of each resource it requests, selected by name, and sees itself Held when
// the counter names its grant, the controller's first write; the status,
// with the signed proof, follows, and is what a consumer of grant status
// sees (the ticket's statusAt).
type lwClient struct {
	c     client.WithWatch
	ns    string
	actor string
	ttl   int32
	// lockDelay is the lock-delay of every grant, in seconds.
	lockDelay int32
	// permits is the spec.permits of every grant; 0 for an exclusive lock.
	permits int32
	// releaseByDelete releases by deleting the grant (UID precondition)
	// instead of setting spec.release: no Released status, no retention
	// delete, no post-release record.
	releaseByDelete bool
	// wctx is the context the client's watches run on.
	wctx context.Context

	mu      sync.Mutex
	tracked map[string]*lwTracked // by grant name
	early   map[string]lwEvent    // events of grants not tracked yet
	// earlyHeld are counter events naming grants not tracked yet.
	earlyHeld map[string]lwHeld
	gone      map[string]bool // released or vanished: ignore
	// counters are the counter watches, by resource.
	counters map[string]*counterWatch
	cancel   context.CancelFunc
	stopped  <-chan struct{}
}

// counterWatch is the client's watch of one resource's FenceCounter,
// selected by name as pkg/lock selects it: the client decodes the events of
// its own resources' counters only, not those of every counter in the
// namespace.
type counterWatch struct {
	// users counts the tracked grants of the resource.
	users   int
	cancel  context.CancelFunc
	stopped chan struct{}
}

// maxIdleCounterWatches is how many counter watches of resources without a
// tracked grant a client keeps open for its next request; beyond it, the
// watch of a resource whose last grant is untracked is closed.
const maxIdleCounterWatches = 8

type lwTracked struct {
	t        *ticket
	resource string
	held     *lockingv1alpha1.LockGrant
	// statusSeen is closed once held is set.
	statusSeen chan struct{}
}

type lwEvent struct {
	g  *lockingv1alpha1.LockGrant
	at time.Time
}

type lwHeld struct {
	fence int64
	at    time.Time
}

// newLWClient starts a client whose grants have leases of ttlSeconds; it
// returns once its watch is established.
func newLWClient(ctx context.Context, cp *controlPlane, ns, actor string, ttlSeconds int32) (*lwClient, error) {
	c, err := cp.newClient()
	if err != nil {
		return nil, err
	}
	l := &lwClient{c: c, ns: ns, actor: actor, ttl: ttlSeconds,
		tracked: map[string]*lwTracked{}, early: map[string]lwEvent{}, earlyHeld: map[string]lwHeld{}, gone: map[string]bool{},
		counters: map[string]*counterWatch{}}
	wctx, cancel := context.WithCancel(ctx)
	l.wctx, l.cancel = wctx, cancel
	grants, err := watchLoop(wctx, c, &lockingv1alpha1.LockGrantList{},
		[]client.ListOption{client.InNamespace(ns), client.MatchingLabels{actorLabel: actor}},
		func(o client.Object, at time.Time) { l.observe(o.(*lockingv1alpha1.LockGrant), at) })
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching the grants of %s: %w", actor, err)
	}
	l.stopped = grants
	return l, nil
}

func (l *lwClient) Close() {
	l.cancel()
	<-l.stopped
	l.mu.Lock()
	watches := make([]*counterWatch, 0, len(l.counters))
	for _, w := range l.counters {
		watches = append(watches, w)
	}
	l.mu.Unlock()
	for _, w := range watches {
		<-w.stopped
	}
}

// followCounter makes sure the client watches resource's FenceCounter, and
// counts one more tracked grant of it; an exclusive lock only (a grant with
// permits learns its slot from its status). The watch is opened in the
// background: its first event is the counter as it is, so nothing written
// before it is established is missed, and the request is not delayed by it.
func (l *lwClient) followCounter(resource string) {
	if l.permits > 1 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.counters[resource]; w != nil {
		w.users++
		return
	}
	ctx, cancel := context.WithCancel(l.wctx)
	w := &counterWatch{users: 1, cancel: cancel, stopped: make(chan struct{})}
	l.counters[resource] = w
	go func() {
		defer close(w.stopped)
		stopped, err := watchLoop(ctx, l.c, &lockingv1alpha1.FenceCounterList{},
			[]client.ListOption{client.InNamespace(l.ns), client.MatchingFields{"metadata.name": lockingv1alpha1.FenceCounterName(resource)}},
			func(o client.Object, at time.Time) { l.observeCounter(o.(*lockingv1alpha1.FenceCounter), at) })
		if err == nil {
			<-stopped
		}
	}()
}

// unfollowCounter counts one tracked grant of resource less, and closes its
// counter watch when no grant of it is tracked and the client keeps more
// idle watches than maxIdleCounterWatches; l.mu held.
func (l *lwClient) unfollowCounter(resource string) {
	w := l.counters[resource]
	if w == nil {
		return
	}
	w.users--
	if w.users > 0 {
		return
	}
	idle := 0
	for _, o := range l.counters {
		if o.users <= 0 {
			idle++
		}
	}
	if idle > maxIdleCounterWatches {
		w.cancel()
		delete(l.counters, resource)
	}
}

// observeCounter marks the grant a counter names Held with its fence, for
// an exclusive lock (a grant with permits learns its slot from its status).
func (l *lwClient) observeCounter(c *lockingv1alpha1.FenceCounter, at time.Time) {
	h := c.Spec.Holder
	if h == nil || l.permits > 1 {
		return
	}
	l.mu.Lock()
	tr := l.tracked[h.Name]
	if tr == nil {
		if !l.gone[h.Name] {
			l.earlyHeld[h.Name] = lwHeld{fence: h.Fence, at: at}
		}
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	tr.t.markHeld(at, h.Fence)
}

func (l *lwClient) observe(g *lockingv1alpha1.LockGrant, at time.Time) {
	l.mu.Lock()
	tr := l.tracked[g.Name]
	if tr == nil {
		if !l.gone[g.Name] {
			l.early[g.Name] = lwEvent{g, at}
		}
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.apply(tr, g, at)
}

func (l *lwClient) apply(tr *lwTracked, g *lockingv1alpha1.LockGrant, at time.Time) {
	switch st := g.Status; {
	case st.Phase == lockingv1alpha1.PhasePending:
		tr.t.markQueued()
	case st.Phase == lockingv1alpha1.PhaseHeld && st.FenceToken > 0 && st.Proof != "":
		l.mu.Lock()
		if tr.held == nil {
			tr.held = g
			close(tr.statusSeen)
		}
		l.mu.Unlock()
		tr.t.markHeld(at, st.FenceToken)
		tr.t.markStatusHeld(at)
	case st.Phase.Final():
		tr.t.fail(fmt.Errorf("grant %s/%s ended %s before it was held", g.Namespace, g.Name, st.Phase))
	}
}

func (l *lwClient) untrack(name string) {
	l.mu.Lock()
	if tr := l.tracked[name]; tr != nil {
		l.unfollowCounter(tr.resource)
	}
	delete(l.tracked, name)
	delete(l.early, name)
	delete(l.earlyHeld, name)
	l.gone[name] = true
	l.mu.Unlock()
}

// Request creates a LockGrant for resource.
func (l *lwClient) Request(ctx context.Context, resource string) (*ticket, error) {
	return l.RequestUnder(ctx, resource, nil)
}

// RequestUnder creates a LockGrant for resource that names session (nil:
// none).
func (l *lwClient) RequestUnder(ctx context.Context, resource string, session *lockingv1alpha1.SessionRef) (*ticket, error) {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "g-", Namespace: l.ns, Labels: map[string]string{actorLabel: l.actor}},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: l.ttl, Session: session, LockDelaySeconds: l.lockDelay, Permits: l.permits},
	}
	l.followCounter(resource)
	if err := l.create(ctx, g); err != nil {
		l.mu.Lock()
		l.unfollowCounter(resource)
		l.mu.Unlock()
		return nil, fmt.Errorf("creating a grant for %s: %w", resource, err)
	}
	t := newTicket()
	t.name = g.Name
	t.status = make(chan struct{})
	tr := &lwTracked{t: t, resource: resource, statusSeen: make(chan struct{})}
	l.mu.Lock()
	l.tracked[g.Name] = tr
	ev, seen := l.early[g.Name]
	delete(l.early, g.Name)
	held, heldSeen := l.earlyHeld[g.Name]
	delete(l.earlyHeld, g.Name)
	l.mu.Unlock()
	if heldSeen {
		t.markHeld(held.at, held.fence)
	}
	if seen {
		l.apply(tr, ev.g, ev.at)
	}
	name, uid := g.Name, g.UID
	t.release = func(ctx context.Context) error {
		defer l.untrack(name)
		return l.release(ctx, name, uid)
	}
	t.vanish = func(ctx context.Context) (time.Time, error) {
		held := l.awaitStatus(ctx, tr)
		l.untrack(name)
		if held == nil || held.Status.ExpiresAt == nil {
			return time.Time{}, fmt.Errorf("grant %s is not held", name)
		}
		return held.Status.ExpiresAt.Time, nil
	}
	return t, nil
}

// create creates g, trying again (up to three times in all) when admission
// could not be reached in time: a create refused for a webhook's timeout
// was not stored, and a client such as pkg/lock tries again.
func (l *lwClient) create(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	for attempt := 1; ; attempt++ {
		c := g.DeepCopy()
		err := l.c.Create(ctx, c)
		if err == nil {
			*g = *c
			return nil
		}
		if attempt == 3 || !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "failed calling webhook") {
			return err
		}
	}
}

// release sets spec.release on the grant with this UID, or deletes it
// under that UID precondition (releaseByDelete).
func (l *lwClient) release(ctx context.Context, name string, uid types.UID) error {
	if l.releaseByDelete {
		g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.ns}}
		if err := l.c.Delete(ctx, g, client.Preconditions{UID: &uid}); err != nil {
			return fmt.Errorf("releasing grant %s by deleting it: %w", name, err)
		}
		return nil
	}
	patch := []byte(fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{"release":true}}`, uid))
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.ns}}
	if err := l.c.Patch(ctx, g, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("releasing grant %s: %w", name, err)
	}
	return nil
}

// awaitStatus waits until the client has seen the held grant's status (it
// may have seen itself Held from the counter first), and returns it; nil
// when ctx ends or holdTimeout passes first.
func (l *lwClient) awaitStatus(ctx context.Context, tr *lwTracked) *lockingv1alpha1.LockGrant {
	ctx, cancel := context.WithTimeout(ctx, holdTimeout)
	defer cancel()
	select {
	case <-tr.statusSeen:
	case <-ctx.Done():
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return tr.held
}

// heldGrant returns the grant of a held ticket as its client observed it,
// waiting for its status when the client saw itself Held from the counter.
func (l *lwClient) heldGrant(ctx context.Context, t *ticket) *lockingv1alpha1.LockGrant {
	l.mu.Lock()
	var found *lwTracked
	for _, tr := range l.tracked {
		if tr.t == t {
			found = tr
		}
	}
	l.mu.Unlock()
	if found == nil {
		return nil
	}
	return l.awaitStatus(ctx, found)
}
