package lockgrant_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/membership"
)

const (
	systemNS      = "lockwarden-system"
	selfID        = "replica-self"
	peerID        = "replica-peer"
	takeoverDelay = 3 * time.Second
	peerLease     = time.Second
)

// The takeover of a resource whose preferred replica is absent, on a real
// API server: this replica runs the controllers as cmd/manager does with
// --grants-on-every-replica and a takeover delay; the "peer" replica is
// only a Lease that the test renews (a replica that is alive but frozen or
// cut off) and then stops renewing (a replica that is gone).
func TestTakeoverFromAnAbsentPreferredReplica(t *testing.T) {
	c := startEnv(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "takeover-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	peer := renewPeer(t, c)

	// The first grant waits for the issuer's keys; after it, timings count.
	waitHeld(t, c, acquire(t, c, ns.Name, resourcePreferredBy(t, ns.Name, selfID, "warmup"), 30), 30*time.Second)

	t.Run("this replica keeps its own Lease fresh", func(t *testing.T) {
		// Renewed every 250 ms for 1 s: two seconds on, its renewTime
		// must be within the Lease's duration of now, by our clock.
		since := time.Now()
		l := &coordinationv1.Lease{}
		if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, client.ObjectKey{Namespace: systemNS, Name: lockgrant.ReplicaLeasePrefix + selfID}, l); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(since.Add(2*time.Second)), nil
		}); err != nil {
			t.Fatalf("the replica's Lease was not renewed for 2 s (%+v): %v", l.Spec, err)
		}
	})

	t.Run("preferred by this replica: granted at once", func(t *testing.T) {
		start := time.Now()
		waitHeld(t, c, acquire(t, c, ns.Name, resourcePreferredBy(t, ns.Name, selfID, "mine"), 30), 30*time.Second)
		if d := time.Since(start); d >= takeoverDelay {
			t.Fatalf("granted after %s, not before the takeover delay %s", d, takeoverDelay)
		}
	})

	var holder *lockingv1alpha1.LockGrant
	res := resourcePreferredBy(t, ns.Name, peerID, "theirs")
	t.Run("preferred by a silent peer: granted after the takeover delay", func(t *testing.T) {
		start := time.Now()
		holder = waitHeld(t, c, acquire(t, c, ns.Name, res, 1), takeoverDelay+20*time.Second)
		if d := time.Since(start); d < takeoverDelay-100*time.Millisecond {
			t.Fatalf("granted after %s: this replica did not leave the resource to its preferred peer for %s", d, takeoverDelay)
		}
	})

	t.Run("the silent peer's holder expires and its waiter is granted", func(t *testing.T) {
		waiter := acquire(t, c, ns.Name, res, 30)
		got := waitHeld(t, c, waiter, 2*takeoverDelay+20*time.Second)
		if got.Status.FenceToken <= holder.Status.FenceToken {
			t.Fatalf("the waiter's fence %d is not above the expired holder's %d", got.Status.FenceToken, holder.Status.FenceToken)
		}
		old := &lockingv1alpha1.LockGrant{}
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(holder), old); err != nil {
			t.Fatal(err)
		}
		if old.Status.Phase != lockingv1alpha1.PhaseExpired {
			t.Fatalf("the first holder is %s, want Expired", old.Status.Phase)
		}
	})

	t.Run("once the peer's Lease lapsed: granted at once", func(t *testing.T) {
		lapsed := peer.stop()
		if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return time.Now().After(lapsed.Add(200 * time.Millisecond)), nil
		}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitHeld(t, c, acquire(t, c, ns.Name, resourcePreferredBy(t, ns.Name, peerID, "orphan"), 30), 30*time.Second)
		if d := time.Since(start); d >= takeoverDelay {
			t.Fatalf("granted after %s: a replica whose Lease lapsed was still preferred", d)
		}
	})

	t.Run("a forged replica Lease that never lapses slows a resource, never stalls it", func(t *testing.T) {
		// Someone who may write Leases in the manager's namespace forges a
		// replica's: an endless duration, a renew time an hour ahead.
		ahead := metav1.NewMicroTime(time.Now().Add(time.Hour))
		ghost := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: lockgrant.ReplicaLeasePrefix + "ghost", Labels: map[string]string{lockgrant.ReplicaLabel: "true"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ghost"), LeaseDurationSeconds: ptr.To(int32(2_000_000_000)), RenewTime: &ahead},
		}
		if err := c.Create(t.Context(), ghost); err != nil {
			t.Fatal(err)
		}
		var res string
		for i := range 1000 {
			r := fmt.Sprintf("ghost/%d", i)
			if membership.Preferred(ns.Name+"/"+lockingv1alpha1.FenceCounterName(r), []string{selfID, "ghost"}) == "ghost" {
				res = r
				break
			}
		}
		// A flood of requests behind the first keeps the resource's state
		// moving, so this replica never sees it quiet for the takeover
		// delay.
		const flood = 4*takeoverDelay + 2*time.Second
		start := time.Now()
		first := acquire(t, c, ns.Name, res, 30)
		ctx, stop := context.WithTimeout(t.Context(), flood)
		defer stop()
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			// Stamped as admission would, after the first request: this
			// suite runs no webhooks, and creation times have whole
			// seconds only.
			g := &lockingv1alpha1.LockGrant{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, GenerateName: "flood-", Annotations: map[string]string{
					lockingv1alpha1.RequestedAtAnnotation: time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano),
				}},
				Spec: lockingv1alpha1.LockGrantSpec{Resource: res, LeaseDurationSeconds: 30},
			}
			_ = c.Create(ctx, g)
		}, 200*time.Millisecond)
		waitHeld(t, c, first, flood)
		// Bounded by the deferral's cap: the delay plus a replica Lease's
		// duration (1 s here), with room for a loaded machine.
		if d := time.Since(start); d >= 3*takeoverDelay {
			t.Fatalf("granted after %s under a forged Lease: the deferral is not capped", d)
		}
	})
}

// startEnv starts a control plane with the CRDs and this replica's
// controllers, and returns an admin client.
func startEnv(t *testing.T) client.Client {
	t.Helper()
	cfg, scheme := startControlPlane(t)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS}}); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:    {Namespaces: map[string]cache.Config{systemNS: {}}},
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{systemNS: {}}},
		}},
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		Clock: clock.RealClock{}, Keyring: &issuer.Keyring{Reader: mgr.GetClient(), Namespace: systemNS},
		Namespace: systemNS, GrantsOnEveryReplica: true,
		Replica: controllers.ReplicaOptions{ID: selfID, TakeoverDelay: takeoverDelay, LeaseDuration: time.Second, LeaseRenew: 250 * time.Millisecond},
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	return c
}

// peerRenewer renews the peer replica's Lease until stopped.
type peerRenewer struct {
	cancel context.CancelFunc
	done   chan time.Time
}

// stop stops renewing and returns when the peer's Lease lapses.
func (p *peerRenewer) stop() time.Time {
	p.cancel()
	return <-p.done
}

func renewPeer(t *testing.T, c client.Client) *peerRenewer {
	t.Helper()
	now := metav1.NowMicro()
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: lockgrant.ReplicaLeasePrefix + peerID, Labels: map[string]string{lockgrant.ReplicaLabel: "true"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(peerID), LeaseDurationSeconds: ptr.To(int32(peerLease / time.Second)), RenewTime: &now},
	}
	if err := c.Create(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	p := &peerRenewer{cancel: cancel, done: make(chan time.Time, 1)}
	go func() {
		last := now.Time
		wait.UntilWithContext(ctx, func(ctx context.Context) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(l), l); err != nil {
				return
			}
			renewed := metav1.NowMicro()
			l.Spec.RenewTime = &renewed
			if c.Update(ctx, l) == nil {
				last = renewed.Time
			}
		}, 200*time.Millisecond)
		p.done <- last.Add(peerLease)
	}()
	t.Cleanup(func() { cancel() })
	return p
}

// resourcePreferredBy returns a resource ID of ns for which id is the
// preferred replica of {self, peer}.
func resourcePreferredBy(t *testing.T, ns, id, prefix string) string {
	t.Helper()
	live := []string{selfID, peerID}
	for i := range 1000 {
		res := fmt.Sprintf("%s/%d", prefix, i)
		key := ns + "/" + lockingv1alpha1.FenceCounterName(res)
		if membership.Preferred(key, live) == id {
			return res
		}
	}
	t.Fatalf("no resource preferred by %s", id)
	return ""
}

func acquire(t *testing.T, c client.Client, ns, res string, ttl int32) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "grant-"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: res, LeaseDurationSeconds: ttl, Owner: "worker"},
	}
	if err := c.Create(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	return g
}

func waitHeld(t *testing.T, c client.Client, g *lockingv1alpha1.LockGrant, timeout time.Duration) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			return false, err
		}
		return cur.Status.Phase == lockingv1alpha1.PhaseHeld, nil
	})
	if err != nil {
		t.Fatalf("grant %s of %s never Held (status %+v): %v", g.Name, g.Spec.Resource, cur.Status, err)
	}
	return cur
}
