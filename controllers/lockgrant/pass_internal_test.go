package lockgrant

import (
	"context"
	"crypto/ed25519"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/issuer"
)

// These tests play one replica's pass against an API server (the fake
// client, which enforces resourceVersion preconditions) and an informer
// cache that may be behind it (laggingCache).

const passNS = "billing"

const passResource = "invoice-batch/2026-12-03"

var passT0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

var counterKey = types.NamespacedName{Namespace: passNS, Name: lockingv1alpha1.FenceCounterName(passResource)}

// fixedKeyring issues in epoch 0 with one key.
type fixedKeyring struct{}

func (fixedKeyring) Params(context.Context) (issuer.Params, error) {
	return issuer.Params{KeyID: "k1", Key: ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))}, nil
}

// laggingCache is the informer cache of a replica: the API server's
// objects, except the counters and the grant list it was told to show as
// they were.
type laggingCache struct {
	client.Client
	mu       sync.Mutex
	counters map[types.NamespacedName]*lockingv1alpha1.FenceCounter
	grants   []lockingv1alpha1.LockGrant
}

func (c *laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	frozen := c.counters[key]
	c.mu.Unlock()
	if fc, ok := obj.(*lockingv1alpha1.FenceCounter); ok && frozen != nil {
		frozen.DeepCopyInto(fc)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.mu.Lock()
	frozen := c.grants
	c.mu.Unlock()
	if gl, ok := list.(*lockingv1alpha1.LockGrantList); ok && frozen != nil {
		gl.Items = nil
		for i := range frozen {
			gl.Items = append(gl.Items, *frozen[i].DeepCopy())
		}
		return nil
	}
	return c.Client.List(ctx, list, opts...)
}

// freeze makes the cache show the counter and the grants as they are now
// in the API server, until the test says otherwise.
func (c *laggingCache) freeze(t *testing.T) {
	t.Helper()
	fc := &lockingv1alpha1.FenceCounter{}
	if err := c.Client.Get(t.Context(), counterKey, fc); err != nil {
		t.Fatal(err)
	}
	var gl lockingv1alpha1.LockGrantList
	if err := c.Client.List(t.Context(), &gl, client.InNamespace(passNS)); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counters = map[types.NamespacedName]*lockingv1alpha1.FenceCounter{counterKey: fc}
	c.grants = gl.Items
}

// countingReader counts the direct reads of FenceCounters and, by name,
// of LockGrants, and the direct lists of LockGrants.
type countingReader struct {
	client.Reader
	mu       sync.Mutex
	counters int
	grants   map[string]int
	lists    int
}

func (r *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*lockingv1alpha1.LockGrantList); ok {
		r.mu.Lock()
		r.lists++
		r.mu.Unlock()
	}
	return r.Reader.List(ctx, list, opts...)
}

func (r *countingReader) grantLists() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.mu.Lock()
	switch obj.(type) {
	case *lockingv1alpha1.FenceCounter:
		r.counters++
	case *lockingv1alpha1.LockGrant:
		if r.grants == nil {
			r.grants = map[string]int{}
		}
		r.grants[key.Name]++
	}
	r.mu.Unlock()
	return r.Reader.Get(ctx, key, obj, opts...)
}

func (r *countingReader) grantReads(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grants[name]
}

func (r *countingReader) counterReads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counters
}

// passEnv is one replica over an API server.
type passEnv struct {
	api    client.Client
	cache  *laggingCache
	direct *countingReader
	r      *Reconciler
}

func newPassEnv(t *testing.T, objs ...client.Object) *passEnv {
	t.Helper()
	scheme := runtime.NewScheme()
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	api := fake.NewClientBuilder().WithScheme(scheme).
		WithIndex(&lockingv1alpha1.LockGrant{}, CounterNameField, func(o client.Object) []string {
			return []string{lockingv1alpha1.FenceCounterName(o.(*lockingv1alpha1.LockGrant).Spec.Resource)}
		}).
		WithIndex(&lockingv1alpha1.LockGrant{}, ResourceField, func(o client.Object) []string {
			return []string{o.(*lockingv1alpha1.LockGrant).Spec.Resource}
		}).
		WithStatusSubresource(&lockingv1alpha1.LockGrant{}).
		WithObjects(objs...).Build()
	e := &passEnv{api: api, cache: &laggingCache{Client: api}, direct: &countingReader{Reader: api}}
	e.r = &Reconciler{Client: e.cache, APIReader: e.direct, Clock: clocktesting.NewFakePassiveClock(passT0.Add(10 * time.Second)), Keyring: fixedKeyring{}}
	return e
}

// startStatuses starts the replica's status writer, as SetupWithManager
// does, until the test ends.
func (e *passEnv) startStatuses(t *testing.T) {
	t.Helper()
	e.r.statuses = newStatusWriter(e.r, true)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = e.r.statuses.Start(ctx)
	}()
	t.Cleanup(func() { cancel(); <-stopped })
}

// pass runs one pass and waits for its statuses to be written.
func (e *passEnv) pass(t *testing.T) {
	t.Helper()
	if _, err := e.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: counterKey}); err != nil {
		t.Fatalf("pass: %v", err)
	}
	if e.r.statuses == nil {
		return
	}
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		e.r.statuses.mu.Lock()
		defer e.r.statuses.mu.Unlock()
		return len(e.r.statuses.queues) == 0, nil
	})
	if err != nil {
		t.Fatal("the pass's statuses were never written")
	}
}

func (e *passEnv) grant(t *testing.T, name string) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{}
	if err := e.api.Get(t.Context(), types.NamespacedName{Namespace: passNS, Name: name}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

func (e *passEnv) counter(t *testing.T) *lockingv1alpha1.FenceCounter {
	t.Helper()
	c := &lockingv1alpha1.FenceCounter{}
	if err := e.api.Get(t.Context(), counterKey, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// moveCounter writes the counter as another replica would.
func (e *passEnv) moveCounter(t *testing.T, fence int64, holder *lockingv1alpha1.LockGrant) {
	t.Helper()
	c := e.counter(t)
	c.Spec = passCounter(fence, holder).Spec
	if err := e.api.Update(t.Context(), c); err != nil {
		t.Fatal(err)
	}
}

// passGrant is a request for passResource made at t0+requested seconds.
func passGrant(name string, requested float64) *lockingv1alpha1.LockGrant {
	return &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: passNS, Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: passT0.Add(time.Duration(requested * float64(time.Second))).Format(time.RFC3339Nano)},
		},
		Spec: lockingv1alpha1.LockGrantSpec{Resource: passResource, Owner: "owner-" + name, LeaseDurationSeconds: 30},
	}
}

// passHeld is g Held with fence until t0+30 s.
func passHeld(g *lockingv1alpha1.LockGrant, fence int64) *lockingv1alpha1.LockGrant {
	at, until := metav1.NewMicroTime(passT0.Add(time.Second)), metav1.NewMicroTime(passT0.Add(31*time.Second))
	g.Status.Phase, g.Status.FenceToken, g.Status.GrantedAt, g.Status.ExpiresAt = lockingv1alpha1.PhaseHeld, fence, &at, &until
	return g
}

func passCounter(fence int64, holder *lockingv1alpha1.LockGrant) *lockingv1alpha1.FenceCounter {
	c := &lockingv1alpha1.FenceCounter{
		ObjectMeta: metav1.ObjectMeta{Namespace: passNS, Name: counterKey.Name},
		Spec:       lockingv1alpha1.FenceCounterSpec{Resource: passResource, Fence: fence},
	}
	if holder != nil {
		c.Spec.Holder = &lockingv1alpha1.FenceHolder{Name: holder.Name, UID: string(holder.UID), Owner: holder.Spec.Owner, Fence: fence,
			ExpiresAt: lockingv1alpha1.FormatInstant(holder.Status.ExpiresAt.Time)}
	}
	return c
}

// A handoff decides on the counter the cache shows: the pass reads no
// counter from the API server; its compare-and-swap stands behind it.
func TestHandoffReadsNoCounterDirectly(t *testing.T) {
	a := passHeld(passGrant("a", 0), 1)
	a.Spec.Release = true
	e := newPassEnv(t, a, passGrant("b", 1), passCounter(1, a))
	e.startStatuses(t)
	e.pass(t)
	if c := e.counter(t); c.Spec.Holder == nil || c.Spec.Holder.Name != "b" || c.Spec.Fence != 2 {
		t.Fatalf("counter %+v; want b holding fence 2", c.Spec)
	}
	if b := e.grant(t, "b"); b.Status.Phase != lockingv1alpha1.PhaseHeld || b.Status.FenceToken != 2 {
		t.Fatalf("b is %s with fence %d; want Held with 2", b.Status.Phase, b.Status.FenceToken)
	}
	if a := e.grant(t, "a"); a.Status.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("a is %s, want Released", a.Status.Phase)
	}
	if n := e.direct.counterReads(); n != 0 {
		t.Fatalf("the handoff read the counter %d times from the API server; want none", n)
	}
}

// A handoff on a grants cache that has shown every change up to the
// counter's version (the informer's handlers saw a's release, stored
// after the counter named a) lists no grants directly: the cache shows
// every grant Held as stored. A cache that has not caught up to the
// counter lists them once before b's Held status.
func TestHandoffOnACaughtUpCacheListsNoGrants(t *testing.T) {
	for _, caughtUp := range []bool{true, false} {
		a := passHeld(passGrant("a", 0), 1)
		e := newPassEnv(t, a, passGrant("b", 1), passCounter(1, a))
		e.startStatuses(t)
		released := e.grant(t, "a")
		released.Spec.Release = true
		if err := e.api.Update(t.Context(), released); err != nil {
			t.Fatal(err)
		}
		counterRV, err := strconv.ParseInt(e.counter(t).ResourceVersion, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if caughtUp {
			e.r.grantsSeen.see(strconv.FormatInt(counterRV+1, 10)) // a's release, stored after the counter
		} else {
			e.r.grantsSeen.see(strconv.FormatInt(counterRV-1, 10))
		}
		e.pass(t)
		if b := e.grant(t, "b"); b.Status.Phase != lockingv1alpha1.PhaseHeld || b.Status.FenceToken != 2 {
			t.Fatalf("caught up %v: b is %s with fence %d; want Held with 2", caughtUp, b.Status.Phase, b.Status.FenceToken)
		}
		if a := e.grant(t, "a"); a.Status.Phase != lockingv1alpha1.PhaseReleased {
			t.Fatalf("caught up %v: a is %s, want Released", caughtUp, a.Status.Phase)
		}
		switch n := e.direct.grantLists(); {
		case caughtUp && n != 0:
			t.Fatalf("the handoff on a caught-up cache listed the grants directly %d times; want none", n)
		case !caughtUp && n != 1:
			t.Fatalf("the handoff on a cache behind the counter listed the grants directly %d times; want once", n)
		}
	}
}

// A cached counter behind the API server (another replica granted b
// meanwhile and has not written b's status yet) makes the pass's swap
// conflict; the pass decides again at once on a direct read and finishes
// the other replica's grant with the fence it issued, never another.
func TestCachedCounterBehindIsCaughtByItsSwap(t *testing.T) {
	a := passHeld(passGrant("a", 0), 1)
	a.Spec.Release = true
	b := passGrant("b", 1)
	e := newPassEnv(t, a, b, passCounter(1, a))
	e.startStatuses(t)
	e.cache.freeze(t)
	bHeld := passHeld(b.DeepCopy(), 2)
	e.moveCounter(t, 2, bHeld)
	e.pass(t)
	c := e.counter(t)
	if c.Spec.Holder == nil || c.Spec.Holder.Name != "b" || c.Spec.Fence != 2 {
		t.Fatalf("counter %+v; want b holding fence 2 as the other replica wrote it", c.Spec)
	}
	if got := e.grant(t, "b"); got.Status.Phase != lockingv1alpha1.PhaseHeld || got.Status.FenceToken != 2 {
		t.Fatalf("b is %s with fence %d; want Held with the counter's fence 2", got.Status.Phase, got.Status.FenceToken)
	}
	if e.direct.counterReads() == 0 {
		t.Fatal("the pass never read the counter directly after its swap conflicted")
	}
}

// A plan that writes statuses and no counter has no compare-and-swap to
// validate the cached counter it was decided on: it is decided again on a
// direct read. Here the cache shows the counter from before a's grant
// while a's status already says Held: decided on the cache alone, a would
// be ended as a holder the counter no longer names.
func TestStatusOnlyPlanIsDecidedOnADirectRead(t *testing.T) {
	a := passGrant("a", 0)
	e := newPassEnv(t, a, passCounter(0, nil))
	e.startStatuses(t)
	e.cache.freeze(t) // the counter before a's grant
	aHeld := passHeld(e.grant(t, "a"), 1)
	e.moveCounter(t, 1, aHeld)
	if err := e.api.Status().Update(t.Context(), aHeld); err != nil {
		t.Fatal(err)
	}
	var gl lockingv1alpha1.LockGrantList
	if err := e.api.List(t.Context(), &gl, client.InNamespace(passNS)); err != nil {
		t.Fatal(err)
	}
	e.cache.mu.Lock()
	e.cache.grants = gl.Items // the grants' informer has a's status
	e.cache.mu.Unlock()

	e.pass(t)
	if got := e.grant(t, "a"); got.Status.Phase != lockingv1alpha1.PhaseHeld || got.Status.FenceToken != 1 {
		t.Fatalf("a is %s with fence %d; the counter names it with fence 1", got.Status.Phase, got.Status.FenceToken)
	}
	if n := e.direct.counterReads(); n != 1 {
		t.Fatalf("the pass read the counter %d times directly; want once, before its status-only plan", n)
	}
}

// Another replica swapped the counter from a to b and stopped before it
// wrote the statuses of that handoff: a is still Held as stored (with its
// release asked for), b Pending. This replica's grants cache is further
// behind: it shows a Pending, as before a was granted. Its pass, which
// writes b's Held status, first lists the resource's grants directly and
// ends a's status before it: never two Held grants of one resource.
func TestHeldStatusIsNotWrittenBesideAStoredHolder(t *testing.T) {
	a, b := passGrant("a", 0), passGrant("b", 1)
	e := newPassEnv(t, a, b, passCounter(0, nil))
	e.startStatuses(t)
	var before lockingv1alpha1.LockGrantList
	if err := e.api.List(t.Context(), &before, client.InNamespace(passNS)); err != nil {
		t.Fatal(err)
	}
	aHeld := passHeld(e.grant(t, "a"), 1)
	if err := e.api.Status().Update(t.Context(), aHeld); err != nil {
		t.Fatal(err)
	}
	aHeld = e.grant(t, "a")
	aHeld.Spec.Release = true
	if err := e.api.Update(t.Context(), aHeld); err != nil {
		t.Fatal(err)
	}
	bHeld := passHeld(e.grant(t, "b"), 2)
	e.moveCounter(t, 2, bHeld)
	e.cache.mu.Lock()
	e.cache.grants = before.Items // a and b Pending, as before a's grant
	e.cache.mu.Unlock()

	e.pass(t)
	if got := e.grant(t, "b"); got.Status.Phase != lockingv1alpha1.PhaseHeld || got.Status.FenceToken != 2 {
		t.Fatalf("b is %s with fence %d; the counter names it with fence 2", got.Status.Phase, got.Status.FenceToken)
	}
	if got := e.grant(t, "a"); !got.Status.Phase.Final() {
		t.Fatalf("a is %s beside b Held; want it ended first", got.Status.Phase)
	}
}

// After a handoff, the replica's caches show neither its swap nor its
// statuses for a while. A pass meanwhile decides on what the replica
// wrote: it writes nothing (no second swap attempt, no status written
// twice) and reads no counter directly. The watch event of its own swap
// starts no pass; another writer's does.
func TestPassAfterItsOwnWritesDecidesOnThem(t *testing.T) {
	a := passHeld(passGrant("a", 0), 1)
	a.Spec.Release = true
	e := newPassEnv(t, a, passGrant("b", 1), passCounter(1, a))
	e.startStatuses(t)
	e.cache.freeze(t)
	before := e.counter(t)
	e.pass(t)
	written := e.counter(t)
	rvs := func() []string {
		return []string{e.counter(t).ResourceVersion, e.grant(t, "a").ResourceVersion, e.grant(t, "b").ResourceVersion}
	}
	after := rvs()
	reads := e.direct.counterReads()

	e.pass(t)
	if got := rvs(); !slices.Equal(got, after) {
		t.Fatalf("a pass on a cache behind this replica's own writes wrote again: versions %v, then %v", after, got)
	}
	if n := e.direct.counterReads(); n != reads {
		t.Fatalf("the pass read the counter directly %d times", n-reads)
	}

	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	h := e.r.counterEvents()
	before.Generation, written.Generation = 1, 2
	h.Update(t.Context(), event.UpdateEvent{ObjectOld: before, ObjectNew: written}, q)
	if q.Len() != 0 {
		t.Fatal("the watch event of the replica's own swap started a pass")
	}
	theirs := written.DeepCopy()
	theirs.ResourceVersion, theirs.Generation = theirs.ResourceVersion+"0", 3
	h.Update(t.Context(), event.UpdateEvent{ObjectOld: written, ObjectNew: theirs}, q)
	if q.Len() != 1 {
		t.Fatal("another writer's change of the counter started no pass")
	}
}

// gatedStatus holds every status write until the test opens the gate,
// and records the order the writes were sent in.
type gatedStatus struct {
	*laggingCache
	gate  chan struct{}
	mu    sync.Mutex
	order []string
}

func (c *gatedStatus) Status() client.SubResourceWriter {
	return gatedWriter{SubResourceWriter: c.laggingCache.Status(), c: c}
}

type gatedWriter struct {
	client.SubResourceWriter
	c *gatedStatus
}

func (w gatedWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	select {
	case <-w.c.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.c.mu.Lock()
	w.c.order = append(w.c.order, obj.GetName())
	w.c.mu.Unlock()
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// A pass returns after its swap, not after its statuses: the resource's
// next swap never waits behind them. The statuses follow in the plan's
// order, the ended holder before the new one.
func TestPassReturnsBeforeItsStatusesAreWritten(t *testing.T) {
	a := passHeld(passGrant("a", 0), 1)
	a.Spec.Release = true
	e := newPassEnv(t, a, passGrant("b", 1), passCounter(1, a))
	gated := &gatedStatus{laggingCache: e.cache, gate: make(chan struct{})}
	e.r.Client = gated
	e.startStatuses(t)

	done := make(chan error, 1)
	go func() {
		_, err := e.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: counterKey})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(gated.gate)
		t.Fatal("the pass waited for its status writes")
	}
	if c := e.counter(t); c.Spec.Holder == nil || c.Spec.Holder.Name != "b" || c.Spec.Fence != 2 {
		t.Fatalf("counter %+v when the pass returned; want b holding fence 2", c.Spec)
	}
	if b := e.grant(t, "b"); b.Status.Phase == lockingv1alpha1.PhaseHeld {
		t.Fatal("b's status was written while the gate was closed")
	}

	close(gated.gate)
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return e.grant(t, "b").Status.Phase == lockingv1alpha1.PhaseHeld && e.grant(t, "a").Status.Phase == lockingv1alpha1.PhaseReleased, nil
	})
	if err != nil {
		t.Fatalf("statuses never written: a %s, b %s", e.grant(t, "a").Status.Phase, e.grant(t, "b").Status.Phase)
	}
	gated.mu.Lock()
	defer gated.mu.Unlock()
	if !slices.Equal(gated.order, []string{"a", "b"}) {
		t.Fatalf("statuses written in the order %v; want the ended holder a first", gated.order)
	}
	if g := e.grant(t, "b"); g.Status.CounterGeneration != e.counter(t).Generation {
		t.Fatalf("b's status names counter generation %d, the counter is at %d", g.Status.CounterGeneration, e.counter(t).Generation)
	}
}

// refusingStatus refuses every status write of the grant named refuse, as
// the API server refuses one its transition rules forbid, and records the
// writes that got through.
type refusingStatus struct {
	*laggingCache
	refuse  string
	mu      sync.Mutex
	written []string
}

func (c *refusingStatus) Status() client.SubResourceWriter {
	return refusingWriter{SubResourceWriter: c.laggingCache.Status(), c: c}
}

type refusingWriter struct {
	client.SubResourceWriter
	c *refusingStatus
}

func (w refusingWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if obj.GetName() == w.c.refuse {
		return apierrors.NewInvalid(lockingv1alpha1.GroupVersion.WithKind("LockGrant").GroupKind(), obj.GetName(), nil)
	}
	w.c.mu.Lock()
	w.c.written = append(w.c.written, obj.GetName())
	w.c.mu.Unlock()
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// When the ended holder's status cannot be written, the new holder's,
// planned after it, is not written either: a user reading statuses never
// sees both Held. The resource is decided again instead.
func TestStatusesAfterAFailedOneAreNotWritten(t *testing.T) {
	a := passHeld(passGrant("a", 0), 1)
	a.Spec.Release = true
	e := newPassEnv(t, a, passGrant("b", 1), passCounter(1, a))
	refusing := &refusingStatus{laggingCache: e.cache, refuse: "a"}
	e.r.Client = refusing
	e.startStatuses(t)
	e.pass(t)

	if c := e.counter(t); c.Spec.Holder == nil || c.Spec.Holder.Name != "b" {
		t.Fatalf("counter %+v after the pass; want b holding", c.Spec)
	}
	refusing.mu.Lock()
	defer refusing.mu.Unlock()
	if len(refusing.written) != 0 {
		t.Fatalf("statuses written after the ended holder's was refused: %v", refusing.written)
	}
	if a, b := e.grant(t, "a"), e.grant(t, "b"); a.Status.Phase != lockingv1alpha1.PhaseHeld || b.Status.Phase == lockingv1alpha1.PhaseHeld {
		t.Fatalf("a %s, b %s; want a still Held in its status and b not yet", a.Status.Phase, b.Status.Phase)
	}
}

// droppingStatus holds the status write of the grant named refuse until the
// test lets it go, then refuses it, as the API server refuses one its
// transition rules forbid; onSwap runs before a counter swap once armed.
// It records the writes that got through with the phase they wrote.
type droppingStatus struct {
	*laggingCache
	refuse  string
	release chan struct{}
	onSwap  func()
	mu      sync.Mutex
	written []string
}

func (c *droppingStatus) Status() client.SubResourceWriter {
	return droppingWriter{SubResourceWriter: c.laggingCache.Status(), c: c}
}

func (c *droppingStatus) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.mu.Lock()
	hook := c.onSwap
	c.onSwap = nil
	c.mu.Unlock()
	if _, ok := obj.(*lockingv1alpha1.FenceCounter); ok && hook != nil {
		hook()
	}
	return c.laggingCache.Update(ctx, obj, opts...)
}

type droppingWriter struct {
	client.SubResourceWriter
	c *droppingStatus
}

func (w droppingWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if obj.GetName() == w.c.refuse {
		select {
		case <-w.c.release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return apierrors.NewInvalid(lockingv1alpha1.GroupVersion.WithKind("LockGrant").GroupKind(), obj.GetName(), nil)
	}
	w.c.mu.Lock()
	w.c.written = append(w.c.written, obj.GetName()+"="+string(obj.(*lockingv1alpha1.LockGrant).Status.Phase))
	w.c.mu.Unlock()
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// A pass decides on this replica's planned statuses before they are
// written. When a write fails, the statuses queued behind it are dropped;
// a pass that decided on one of them meanwhile (the ended holder taken as
// Released) must not write its new holder Held while the ended one still
// reads Held: its statuses are decided again.
func TestStatusesDecidedOnDroppedPlansAreDecidedAgain(t *testing.T) {
	// s ended long ago, but this replica's cache still shows it Held: its
	// status write is refused. a holds and has asked to be released.
	s := passHeld(passGrant("s", 0), 1)
	s.Spec.Release = true
	a := passHeld(passGrant("a", 1), 2)
	a.Spec.Release = true
	storedS := s.DeepCopy()
	storedS.Status.Phase = lockingv1alpha1.PhaseReleased
	e := newPassEnv(t, storedS, a, passCounter(2, a))
	e.cache.mu.Lock()
	e.cache.grants = []lockingv1alpha1.LockGrant{*s.DeepCopy(), *a.DeepCopy()}
	e.cache.mu.Unlock()
	dropping := &droppingStatus{laggingCache: e.cache, refuse: "s", release: make(chan struct{})}
	e.r.Client = dropping
	e.startStatuses(t)

	// The first pass frees the resource and queues s's end, then a's; the
	// write of s's is held.
	if _, err := e.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: counterKey}); err != nil {
		t.Fatal(err)
	}
	if c := e.counter(t); c.Spec.Holder != nil {
		t.Fatalf("counter %+v after the first pass; want it free", c.Spec)
	}
	// b asks; the second pass decides on a as planned (Released) and
	// grants b. Before its swap lands, s's write is refused, and the
	// writer drops a's status queued behind it.
	b := passGrant("b", 2)
	if err := e.api.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if err := e.api.Get(t.Context(), client.ObjectKeyFromObject(b), b); err != nil {
		t.Fatal(err)
	}
	e.cache.mu.Lock()
	e.cache.grants = append(e.cache.grants, *b.DeepCopy())
	e.cache.mu.Unlock()
	dropping.mu.Lock()
	dropping.onSwap = func() {
		close(dropping.release)
		err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			e.r.statuses.mu.Lock()
			defer e.r.statuses.mu.Unlock()
			return len(e.r.statuses.queues) == 0, nil
		})
		if err != nil {
			t.Error("the writer never dropped the statuses behind the refused one")
		}
	}
	dropping.mu.Unlock()
	if _, err := e.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: counterKey}); err != nil {
		t.Fatal(err)
	}
	if c := e.counter(t); c.Spec.Holder == nil || c.Spec.Holder.Name != "b" {
		t.Fatalf("counter %+v after the second pass; want b holding", c.Spec)
	}

	// The cache catches up; passes run until b reads Held.
	e.cache.mu.Lock()
	e.cache.grants = nil
	e.cache.mu.Unlock()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		e.pass(t)
		return e.grant(t, "b").Status.Phase == lockingv1alpha1.PhaseHeld, nil
	})
	if err != nil {
		t.Fatalf("b never read Held: %s", e.grant(t, "b").Status.Phase)
	}
	dropping.mu.Lock()
	defer dropping.mu.Unlock()
	ia, ib := slices.Index(dropping.written, "a=Released"), slices.Index(dropping.written, "b=Held")
	if ia < 0 || ib < ia {
		t.Fatalf("statuses written %v: b read Held while a still read Held", dropping.written)
	}
}

// A pass that would end a grant its cached copy shows Held while the
// counter names another reads that grant directly before it writes the
// end. Here another replica swapped the counter from a, whose owner had
// released it, to b, and its status writes have not landed; this
// replica's grants cache is from before the release. Decided on the
// cache, a would be ended Expired (superseded) although its owner released
// it 9 s into a 30 s lease. The pass reads a directly (and, as it writes
// b's Held status, lists the grants directly), and ends a Released, or
// writes nothing for a and asks for a pass soon; once the cache has caught
// up, a ends Released.
func TestUnnamedHeldGrantIsReadBeforeItIsEnded(t *testing.T) {
	a := passHeld(passGrant("a", 0), 1)
	b := passGrant("b", 1)
	e := newPassEnv(t, a, b, passCounter(1, a))
	e.startStatuses(t)
	var gl lockingv1alpha1.LockGrantList
	if err := e.api.List(t.Context(), &gl, client.InNamespace(passNS)); err != nil {
		t.Fatal(err)
	}
	e.cache.mu.Lock()
	e.cache.grants = gl.Items // the grants as they were before the release
	e.cache.mu.Unlock()

	released := e.grant(t, "a")
	released.Spec.Release = true
	if err := e.api.Update(t.Context(), released); err != nil {
		t.Fatal(err)
	}
	e.moveCounter(t, 2, passHeld(b.DeepCopy(), 2)) // the other replica's swap

	res, err := e.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: counterKey})
	if err != nil {
		t.Fatal(err)
	}
	e.pass(t) // and its statuses written
	if n := e.direct.grantReads("a"); n == 0 {
		t.Fatal("the pass ended a, which no counter names, without reading it directly")
	}
	// The pass writes b's Held status, so it has listed the grants
	// directly too, and may end a on its stored copy (released): as
	// Released, never otherwise.
	switch got := e.grant(t, "a"); got.Status.Phase {
	case lockingv1alpha1.PhaseReleased:
	case lockingv1alpha1.PhaseHeld:
		if res.RequeueAfter <= 0 || res.RequeueAfter > cacheCatchUp {
			t.Fatalf("the pass left a as stored and asks for the next one in %s; want at most %s, for the cache to catch up", res.RequeueAfter, cacheCatchUp)
		}
	default:
		t.Fatalf("a is %s (%v) on a cache from before its release; want Released, or left as stored (Held, released) until the cache caught up", got.Status.Phase, got.Status.Conditions)
	}

	e.cache.mu.Lock()
	e.cache.grants = nil // caught up
	e.cache.mu.Unlock()
	e.pass(t)
	if got := e.grant(t, "a"); got.Status.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("a is %s once the cache caught up; want Released", got.Status.Phase)
	}
}

// heldBeside records, at every status write that makes a grant Held, the
// other grants the API server stores as Held at that moment.
type heldBeside struct {
	*laggingCache
	api    client.Client
	mu     sync.Mutex
	beside []string
}

func (c *heldBeside) Status() client.SubResourceWriter {
	return heldBesideWriter{SubResourceWriter: c.laggingCache.Status(), c: c}
}

type heldBesideWriter struct {
	client.SubResourceWriter
	c *heldBeside
}

func (w heldBesideWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if g, ok := obj.(*lockingv1alpha1.LockGrant); ok && g.Status.Phase == lockingv1alpha1.PhaseHeld {
		var stored lockingv1alpha1.LockGrantList
		if err := w.c.api.List(ctx, &stored, client.InNamespace(passNS)); err != nil {
			return err
		}
		for i := range stored.Items {
			if o := &stored.Items[i]; o.Name != g.Name && o.Status.Phase == lockingv1alpha1.PhaseHeld {
				w.c.mu.Lock()
				w.c.beside = append(w.c.beside, g.Name+" beside "+o.Name)
				w.c.mu.Unlock()
			}
		}
	}
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// Another replica granted a (fence 1) and handed its Held status to its
// status writer; a's owner, which learns from the counter, released at
// once; that replica's next pass swapped the counter from a to b (fence 2)
// while a's Held was on its way, so a's Held was stored after the swap, and
// the replica stopped before it wrote a's end. (a was granted ahead of b,
// requested a moment earlier, because that replica's cache did not show b
// yet.) This replica's grants cache has shown every change up to the
// counter's version, but not a's late Held: it shows a Pending with its
// release asked for. Its pass writes b's Held; before it, no other grant
// may be Held as stored. On the counter's version alone the cache looks
// caught up, and without the direct list, b's Held was written while a
// still read Held (a's end, a withdrawn request's, came after b's Held).
func TestHeldStatusIsNotWrittenBesideALateHeld(t *testing.T) {
	a, b := passGrant("a", 1), passGrant("b", 0)
	e := newPassEnv(t, a, b, passCounter(0, nil))
	watching := &heldBeside{laggingCache: e.cache, api: e.api}
	e.r.Client = watching
	e.startStatuses(t)

	e.moveCounter(t, 1, passHeld(e.grant(t, "a"), 1))
	released := e.grant(t, "a")
	released.Spec.Release = true
	if err := e.api.Update(t.Context(), released); err != nil {
		t.Fatal(err)
	}
	var cached lockingv1alpha1.LockGrantList // a Pending with its release, b Pending
	if err := e.api.List(t.Context(), &cached, client.InNamespace(passNS)); err != nil {
		t.Fatal(err)
	}
	e.moveCounter(t, 2, passHeld(e.grant(t, "b"), 2))
	late := passHeld(e.grant(t, "a"), 1) // a's Held, stored after the swap to b
	if err := e.api.Status().Update(t.Context(), late); err != nil {
		t.Fatal(err)
	}
	e.cache.mu.Lock()
	e.cache.grants = cached.Items
	e.cache.mu.Unlock()
	e.r.grantsSeen.see(e.counter(t).ResourceVersion) // the grants cache has caught up to the counter

	e.pass(t)
	if got := e.grant(t, "b"); got.Status.Phase != lockingv1alpha1.PhaseHeld || got.Status.FenceToken != 2 {
		t.Fatalf("b is %s with fence %d; the counter names it with fence 2", got.Status.Phase, got.Status.FenceToken)
	}
	if got := e.grant(t, "a"); !got.Status.Phase.Final() {
		t.Fatalf("a is %s beside b Held; want it ended", got.Status.Phase)
	}
	watching.mu.Lock()
	defer watching.mu.Unlock()
	if len(watching.beside) != 0 {
		t.Fatalf("Held written while another grant read Held as stored: %v", watching.beside)
	}
}
