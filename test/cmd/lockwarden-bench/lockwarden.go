package main

import (
	"context"
	"fmt"
	"sync"
	"time"

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
// merge patch carrying the grant's UID as a precondition. Like pkg/lock's
// handle of an exclusive lock, it also watches the namespace's
// FenceCounters, and sees itself Held when a counter names its grant, the
// controller's first write; the status, with the signed proof, follows.
type lwClient struct {
	c     client.WithWatch
	ns    string
	actor string
	ttl   int32
	// lockDelay is the lock-delay of every grant, in seconds.
	lockDelay int32
	// permits is the spec.permits of every grant; 0 for an exclusive lock.
	permits int32

	mu      sync.Mutex
	tracked map[string]*lwTracked // by grant name
	early   map[string]lwEvent    // events of grants not tracked yet
	// earlyHeld are counter events naming grants not tracked yet.
	earlyHeld map[string]lwHeld
	gone      map[string]bool // released or vanished: ignore
	cancel    context.CancelFunc
	stopped   <-chan struct{}
}

type lwTracked struct {
	t    *ticket
	held *lockingv1alpha1.LockGrant
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
		tracked: map[string]*lwTracked{}, early: map[string]lwEvent{}, earlyHeld: map[string]lwHeld{}, gone: map[string]bool{}}
	wctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	grants, err := watchLoop(wctx, c, &lockingv1alpha1.LockGrantList{},
		[]client.ListOption{client.InNamespace(ns), client.MatchingLabels{actorLabel: actor}},
		func(o client.Object, at time.Time) { l.observe(o.(*lockingv1alpha1.LockGrant), at) })
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watching the grants of %s: %w", actor, err)
	}
	counters, err := watchLoop(wctx, c, &lockingv1alpha1.FenceCounterList{}, []client.ListOption{client.InNamespace(ns)},
		func(o client.Object, at time.Time) { l.observeCounter(o.(*lockingv1alpha1.FenceCounter), at) })
	if err != nil {
		cancel()
		<-grants
		return nil, fmt.Errorf("watching the fence counters of %s: %w", ns, err)
	}
	stopped := make(chan struct{})
	go func() {
		<-grants
		<-counters
		close(stopped)
	}()
	l.stopped = stopped
	return l, nil
}

func (l *lwClient) Close() {
	l.cancel()
	<-l.stopped
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
	case st.Phase.Final():
		tr.t.fail(fmt.Errorf("grant %s/%s ended %s before it was held", g.Namespace, g.Name, st.Phase))
	}
}

func (l *lwClient) untrack(name string) {
	l.mu.Lock()
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
	if err := l.c.Create(ctx, g); err != nil {
		return nil, fmt.Errorf("creating a grant for %s: %w", resource, err)
	}
	t := newTicket()
	t.name = g.Name
	tr := &lwTracked{t: t, statusSeen: make(chan struct{})}
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

// release sets spec.release on the grant with this UID.
func (l *lwClient) release(ctx context.Context, name string, uid types.UID) error {
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
