package lockgrant_test

import (
	"context"
	"crypto/ed25519"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// These tests play manager replicas against a real API server (its status
// transition rules included), each replica a lockgrant.Reconciler whose
// informer cache is behindCache: the API server's objects, except those
// the test holds as they were. No manager runs: the test alone decides
// when each replica passes.

// startAPIServer starts an API server with lockwarden's CRDs and returns
// an admin client.
func startAPIServer(t *testing.T) client.WithWatch {
	t.Helper()
	cfg, scheme := startControlPlane(t)
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startControlPlane starts etcd and an API server with lockwarden's CRDs
// until the test ends, and returns its admin config and the scheme of
// lockwarden's and Kubernetes' kinds.
func startControlPlane(t *testing.T) (*rest.Config, *runtime.Scheme) {
	t.Helper()
	env := envtest.StartControlPlane(t)
	return env.Config, env.Scheme
}

// oneKey issues in epoch 0 with one key.
type oneKey struct{}

func (oneKey) Params(context.Context) (issuer.Params, error) {
	return issuer.Params{KeyID: "k1", Key: ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))}, nil
}

// behindCache is a replica's informer cache: the API server's objects, as
// the manager's cache lists them (grants by their counter's name), except
// the grants and the Leases the test holds as they were (hold), until it
// lets the cache catch up (catchUp).
type behindCache struct {
	client.Client
	mu     sync.Mutex
	grants []lockingv1alpha1.LockGrant
	leases map[types.NamespacedName]*coordinationv1.Lease
}

// holdGrants makes the cache show ns's grants as they are now.
func (c *behindCache) holdGrants(t *testing.T, ns string) {
	t.Helper()
	var gl lockingv1alpha1.LockGrantList
	if err := c.Client.List(t.Context(), &gl, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grants = gl.Items
}

// holdLease makes the cache show Lease key as it is now.
func (c *behindCache) holdLease(t *testing.T, key types.NamespacedName) {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := c.Client.Get(t.Context(), key, l); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leases == nil {
		c.leases = map[types.NamespacedName]*coordinationv1.Lease{}
	}
	c.leases[key] = l
}

func (c *behindCache) catchUp() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grants, c.leases = nil, nil
}

func (c *behindCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.mu.Lock()
	held := c.leases[key]
	c.mu.Unlock()
	if l, ok := obj.(*coordinationv1.Lease); ok && held != nil {
		held.DeepCopyInto(l)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// List lists the grants of one resource (lockgrant.CounterNameField), as
// the manager's cache index does.
func (c *behindCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gl, ok := list.(*lockingv1alpha1.LockGrantList)
	if !ok {
		return c.Client.List(ctx, list, opts...)
	}
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	counter, _ := lo.FieldSelector.RequiresExactMatch(lockgrant.CounterNameField)
	c.mu.Lock()
	items := c.grants
	c.mu.Unlock()
	if items == nil {
		var all lockingv1alpha1.LockGrantList
		if err := c.Client.List(ctx, &all, client.InNamespace(lo.Namespace)); err != nil {
			return err
		}
		items = all.Items
	}
	gl.Items = nil
	for i := range items {
		if items[i].Namespace == lo.Namespace && lockingv1alpha1.FenceCounterName(items[i].Spec.Resource) == counter {
			gl.Items = append(gl.Items, *items[i].DeepCopy())
		}
	}
	return nil
}

// replicaOver is a manager replica that has just started, over cache.
func replicaOver(api client.Client, cache client.Client, clk *clocktesting.FakeClock) *lockgrant.Reconciler {
	return &lockgrant.Reconciler{Client: cache, APIReader: api, Clock: clk, Keyring: oneKey{}}
}

func testNamespace(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "behind-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// request creates a request for res by owner, admitted at at.
func request(t *testing.T, c client.Client, ns, name, res string, ttl int32, at time.Time, mutate ...func(*lockingv1alpha1.LockGrant)) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: at.UTC().Format(time.RFC3339Nano)}},
		Spec: lockingv1alpha1.LockGrantSpec{Resource: res, Owner: "owner-" + name, LeaseDurationSeconds: ttl},
	}
	for _, m := range mutate {
		m(g)
	}
	if err := c.Create(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	return g
}

func stored(t *testing.T, c client.Client, g *lockingv1alpha1.LockGrant) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(g), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func releaseGrant(t *testing.T, c client.Client, g *lockingv1alpha1.LockGrant) {
	t.Helper()
	cur := stored(t, c, g)
	cur.Spec.Release = true
	if err := c.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
}

func passOf(t *testing.T, r *lockgrant.Reconciler, ns, res string) (reconcile.Result, error) {
	t.Helper()
	return r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(res)}})
}

func readyReason(g *lockingv1alpha1.LockGrant) string {
	for _, c := range g.Status.Conditions {
		if c.Type == lockingv1alpha1.ConditionReady {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// The rolling upgrade's EXPIRED release. Replica 1 hands the resource from
// a, whose owner released it 0.2 s into its 10 s lease, to b: its counter
// swap lands, its status writes have not yet (here: a's write fails once).
// Replica 2 has just started: it reads the counter fresh, while its grants
// cache is from before the release. It sees a Held and not named by the
// counter; on that copy a ends Expired (superseded). It reads the grants
// directly first (a's own read, and the list before b's Held status) and
// ends a on what is stored; a ends Released, never EXPIRED.
func TestReleasedHolderEndsReleasedOnACacheBehind(t *testing.T) {
	api := startAPIServer(t)
	ns := testNamespace(t, api)
	const res = "ledger/close"
	clk := clocktesting.NewFakeClock(time.Now())
	a := request(t, api, ns, "a", res, 10, clk.Now())
	b := request(t, api, ns, "b", res, 10, clk.Now().Add(time.Millisecond))

	// Replica 1, whose status writes of a fail while failing says so.
	var failA sync.Mutex
	failing := false
	one := interceptor.NewClient(api, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			failA.Lock()
			fail := failing && obj.GetName() == "a"
			failA.Unlock()
			if fail {
				return apierrors.NewServerTimeout(lockingv1alpha1.GroupVersion.WithResource("lockgrants").GroupResource(), "patch", 1)
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	r1 := replicaOver(api, &behindCache{Client: one}, clk)
	if _, err := passOf(t, r1, ns, res); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, api, a); got.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("a is %s; want Held", got.Status.Phase)
	}

	cache2 := &behindCache{Client: api}
	cache2.holdGrants(t, ns) // replica 2's grants: a Held, b Pending
	r2 := replicaOver(api, cache2, clk)

	clk.Step(200 * time.Millisecond)
	releaseGrant(t, api, a)
	failA.Lock()
	failing = true
	failA.Unlock()
	if _, err := passOf(t, r1, ns, res); err == nil {
		t.Fatal("replica 1's status write of a was to fail")
	}
	if c := counterIn(t, api, ns, res); c.Spec.Holder == nil || c.Spec.Holder.Name != "b" {
		t.Fatalf("replica 1 did not hand the resource to b: counter %+v", c.Spec)
	}

	r2res, err := passOf(t, r2, ns, res)
	if err != nil {
		t.Fatal(err)
	}
	// Replica 2 writes b's Held status, so it lists the grants directly
	// first and ends a on what is stored (released); a pass that ended a
	// on its cached copy would end it Expired. Either way, never before
	// a's end: b Held while a reads Held is a second holder.
	aNow := stored(t, api, a)
	if aNow.Status.Phase.Final() && aNow.Status.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("replica 2 ended a %s (%s) on its cached copy from before the release", aNow.Status.Phase, readyReason(aNow))
	}
	if !aNow.Status.Phase.Final() && (r2res.RequeueAfter <= 0 || r2res.RequeueAfter > 100*time.Millisecond) {
		t.Fatalf("replica 2 left a as stored and asks for its next pass in %s; want within 100 ms, once its cache caught up", r2res.RequeueAfter)
	}
	if got := stored(t, api, b); got.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("b is %s; want Held, as the counter says", got.Status.Phase)
	}

	// Replica 2's cache catches up, and it decides again (replica 1's
	// retry would end a just the same).
	cache2.catchUp()
	if _, err := passOf(t, r2, ns, res); err != nil {
		t.Fatal(err)
	}
	failA.Lock()
	failing = false
	failA.Unlock()
	if _, err := passOf(t, r1, ns, res); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, api, a); got.Status.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("a is %s (%s); its owner released it 0.2 s into its 10 s lease: want Released", got.Status.Phase, readyReason(got))
	}
}

// A replica observed b's session Lease a while ago; its Lease cache is
// behind since, while the client renewed on its cadence. When a is
// released, b is the head of the queue, and as cached its session looks
// overdue (its renewal due and not seen): b would be withdrawn at its
// turn. The replica reads the Lease directly first, observes the renewal,
// and grants b.
func TestWaiterOfALiveSessionIsGrantedOnALeaseCacheBehind(t *testing.T) {
	api := startAPIServer(t)
	ns := testNamespace(t, api)
	const res = "ledger/close"
	clk := clocktesting.NewFakeClock(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "session-b", Labels: map[string]string{lockingv1alpha1.SessionLabel: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("owner-b"), LeaseDurationSeconds: ptr.To[int32](9),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	if err := api.Create(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	a := request(t, api, ns, "a", res, 30, clk.Now())
	b := request(t, api, ns, "b", res, 30, clk.Now().Add(time.Millisecond), func(g *lockingv1alpha1.LockGrant) {
		g.Spec.Session = &lockingv1alpha1.SessionRef{Name: lease.Name, UID: string(lease.UID)}
	})

	cache := &behindCache{Client: api}
	r := replicaOver(api, cache, clk)
	if _, err := passOf(t, r, ns, res); err != nil { // a Held, b waits; b's session observed now
		t.Fatal(err)
	}
	if got := stored(t, api, b); got.Status.Phase != lockingv1alpha1.PhasePending {
		t.Fatalf("b is %s; want Pending", got.Status.Phase)
	}
	cache.holdLease(t, client.ObjectKeyFromObject(lease))

	// The client renews every 3 s; 5 s on, the cache has shown none of it.
	for range 2 {
		clk.Step(2500 * time.Millisecond)
		cur := &coordinationv1.Lease{}
		if err := api.Get(t.Context(), client.ObjectKeyFromObject(lease), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		if err := api.Update(t.Context(), cur); err != nil {
			t.Fatal(err)
		}
		if _, err := passOf(t, r, ns, res); err != nil {
			t.Fatal(err)
		}
	}
	releaseGrant(t, api, a)
	if _, err := passOf(t, r, ns, res); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, api, a); got.Status.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("a is %s; want Released", got.Status.Phase)
	}
	if got := stored(t, api, b); got.Status.Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("b is %s (%s); its client renewed its session on its cadence: want Held", got.Status.Phase, readyReason(got))
	}
}

func counterIn(t *testing.T, c client.Client, ns, res string) *lockingv1alpha1.FenceCounter {
	t.Helper()
	fc := &lockingv1alpha1.FenceCounter{}
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(res)}, fc); err != nil {
		t.Fatal(err)
	}
	return fc
}
