package integration

import (
	"context"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// replicaSkew is the clock-skew bound between manager replicas that
// docs/ha.md states.
const replicaSkew = 250 * time.Millisecond

// startReplica runs a second replica's LockGrant controller beside the
// suite's, on the suite's clock moved by skew, until the test ends.
func startReplica(t *testing.T, skew time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := env.StartReplica(ctx, envtest.SkewedClock{Base: clk, Skew: skew}); err != nil {
		t.Fatal(err)
	}
}

// stays checks that cond keeps holding for d (a state that must not
// change, such as a lease that must not end yet).
func stays(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, d, true, func(context.Context) (bool, error) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
		return false, nil
	})
	if err != nil && t.Context().Err() != nil {
		t.Fatal(err)
	}
}

// clockSkewCase: a holder with a waiter, two replicas reconciling the
// resource, the second with a skewed clock. The lease must last until
// expiresAt-skew at least, and then pass to the waiter with a higher fence.
func clockSkewCase(t *testing.T, prefix string, skew time.Duration) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, prefix+"-a"), as(t, prefix+"-b")
	startReplica(t, skew)

	tl.at(0)
	ga := mustAcquire(t, a, ns, 10)
	gb, err := acquire(t, b, ns, 10)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gb, lockingv1alpha1.PhasePending)
	exp := ga.Status.ExpiresAt.Time

	// Just before the earliest moment any replica sees the lease end.
	earliest := exp.Add(-max(skew, 0))
	clk.SetTime(earliest.Add(-100 * time.Millisecond))
	wake(t, ga)
	stays(t, "A's lease before expiresAt-skew", time.Second, func() bool {
		return get(t, ga).Status.Phase == lockingv1alpha1.PhaseHeld && get(t, gb).Status.Phase == lockingv1alpha1.PhasePending
	})

	// At expiresAt by the clock that is furthest ahead, the lease ends and
	// the waiter holds, with a higher fence.
	clk.SetTime(earliest)
	wake(t, ga)
	ga = waitPhase(t, ga, lockingv1alpha1.PhaseExpired)
	gb = waitPhase(t, gb, lockingv1alpha1.PhaseHeld)
	if gb.Status.FenceToken <= ga.Status.FenceToken {
		t.Fatalf("B's fence %d is not above A's %d", gb.Status.FenceToken, ga.Status.FenceToken)
	}

	// Both replicas reconcile again later, the slow one past A's expiry
	// too: nothing moves, no fence is issued again.
	clk.SetTime(exp.Add(2 * replicaSkew))
	wake(t, gb)
	stays(t, "B's lease and the counter", time.Second, func() bool {
		c, g := counterOf(t, ns), get(t, gb)
		return g.Status.Phase == lockingv1alpha1.PhaseHeld && g.Status.FenceToken == gb.Status.FenceToken &&
			c.Spec.Fence == gb.Status.FenceToken && c.Spec.Holder != nil && c.Spec.Holder.UID == string(gb.UID) &&
			get(t, ga).Status.Phase == lockingv1alpha1.PhaseExpired
	})
}

// A second replica whose clock is ahead by the bound ends a lease up to
// the bound early (the holder's margin covers it), never earlier.
func TestHAReplicaClockAhead(t *testing.T) { clockSkewCase(t, "ha-ahead", replicaSkew) }

// A second replica whose clock is behind by the bound does not hold a
// lease past its end: the other replica ends it on time.
func TestHAReplicaClockBehind(t *testing.T) { clockSkewCase(t, "ha-behind", -replicaSkew) }

// Two replicas reconcile every resource at once while owners take turns:
// every grant gets its own fence, strictly increasing in grant order, and
// no two grants are ever Held together.
func TestHATwoReplicasHandOff(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	startReplica(t, replicaSkew)
	tl.at(0)
	owners := []*actor{as(t, "ha-turn-a"), as(t, "ha-turn-b"), as(t, "ha-turn-c")}
	var fences []int64
	ownerOf := map[types.UID]*actor{}
	for _, o := range owners {
		g, err := acquire(t, o, ns, 30)
		if err != nil {
			t.Fatal(err)
		}
		ownerOf[g.UID] = o
	}
	for round := 0; round < 12; round++ {
		var held *lockingv1alpha1.LockGrant
		waitUntil(t, "one grant Held", func() (bool, error) {
			var list lockingv1alpha1.LockGrantList
			if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
				return false, err
			}
			held = nil
			n := 0
			for i := range list.Items {
				if list.Items[i].Status.Phase == lockingv1alpha1.PhaseHeld {
					n++
					held = &list.Items[i]
				}
			}
			if n > 1 {
				t.Fatalf("%d grants Held at once", n)
			}
			return n == 1, nil
		})
		fences = append(fences, held.Status.FenceToken)
		owner := ownerOf[held.UID]
		if err := release(t, owner, held); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, held, lockingv1alpha1.PhaseReleased)
		g, err := acquire(t, owner, ns, 30)
		if err != nil {
			t.Fatal(err)
		}
		ownerOf[g.UID] = owner
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences not strictly increasing: %v", fences)
		}
	}
}

// With no webhook reachable, an owner can still delete its grant and
// anyone with delete rights a finished one (the LockGrant webhook's
// matchConditions leave those out of admission); a forced release of a
// live grant by someone else still fails closed.
func TestHADeleteWithoutWebhook(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, "ha-del-a"), as(t, "ha-del-b")
	tl.at(0)
	ga := mustAcquire(t, a, ns, 10)
	if err := release(t, a, ga); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, ga, lockingv1alpha1.PhaseReleased)
	gb := mustAcquire(t, b, ns, 10)
	gb2, err := acquire(t, b, ns, 10)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gb2, lockingv1alpha1.PhasePending)

	unreachableLockGrantWebhook(t)

	if err := a.c.Delete(t.Context(), gb); err == nil {
		t.Fatal("a forced release by a non-owner was admitted with no webhook reachable")
	}
	if g := get(t, gb); g.DeletionTimestamp != nil {
		t.Fatal("the refused forced release marked the grant for deletion")
	}
	if err := b.c.Delete(t.Context(), gb2); err != nil {
		t.Fatalf("the owner deleting its own waiting grant: %v", err)
	}
	if err := admin.Delete(t.Context(), ga); err != nil {
		t.Fatalf("deleting a finished grant: %v", err)
	}
	if err := b.c.Delete(t.Context(), gb); err != nil {
		t.Fatalf("the owner deleting its own held grant: %v", err)
	}
}

// unreachableLockGrantWebhook points the LockGrant validating webhook at a
// port nobody listens on, as if no replica ran, until the test ends.
func unreachableLockGrantWebhook(t *testing.T) {
	t.Helper()
	key := types.NamespacedName{Name: "validating-webhook-configuration"}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := admin.Get(t.Context(), key, cfg); err != nil {
		t.Fatal(err)
	}
	orig := cfg.DeepCopy()
	for i := range cfg.Webhooks {
		if cfg.Webhooks[i].Name == "vlockgrant.locking.lockwarden.io" {
			cfg.Webhooks[i].ClientConfig.URL = ptr.To("https://127.0.0.1:1/validate-locking-lockwarden-io-v1alpha1-lockgrant")
		}
	}
	if err := admin.Update(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cur := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := admin.Get(context.Background(), key, cur); err != nil {
			t.Error(err)
			return
		}
		cur.Webhooks = orig.Webhooks
		if err := admin.Update(context.Background(), cur); err != nil {
			t.Error(err)
		}
	})
}

// A replica whose grants cache stopped (a replica resumed after a freeze,
// whose watch has not delivered what it missed yet) while its reads of the
// counter are fresh: it must not grant a request that was withdrawn in the
// meantime. The cache shows A Held and B waiting; since then B withdrew
// and A released, and the running replica freed the counter. Granting B on
// that cache would swap the counter to a grant that had already ended and
// spend a fence on it.
func TestHAStaleCacheGrantsNoEndedRequest(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, "ha-stale-a"), as(t, "ha-stale-b")
	tl.at(0)
	ga := mustAcquire(t, a, ns, 30)
	gb, err := acquire(t, b, ns, 30)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gb, lockingv1alpha1.PhasePending)
	frozen := pausedCache(t, ns)

	if err := release(t, b, gb); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gb, lockingv1alpha1.PhaseReleased)
	if err := release(t, a, ga); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, ga, lockingv1alpha1.PhaseReleased)
	before := counterOf(t, ns)
	if before.Spec.Holder != nil {
		t.Fatalf("the counter still names %s after both released", before.Spec.Holder.Name)
	}

	stale := &lockgrant.Reconciler{
		Client: frozen, APIReader: admin, Clock: clk,
		Keyring: &issuer.Keyring{Reader: admin, Namespace: managerNamespace},
	}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(before)}
	if _, err := stale.Reconcile(t.Context(), req); err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
	after := counterOf(t, ns)
	if after.Spec.Fence != before.Spec.Fence || after.Spec.Holder != nil {
		t.Fatalf("the stale replica swapped the counter from fence %d to %d, holder %+v: it granted a request withdrawn before its pass",
			before.Spec.Fence, after.Spec.Fence, after.Spec.Holder)
	}
	if g := get(t, gb); g.Status.Phase != lockingv1alpha1.PhaseReleased || g.Status.FenceToken != 0 {
		t.Fatalf("the withdrawn request is %s with fence %d", g.Status.Phase, g.Status.FenceToken)
	}
}

// pausedCache returns a client that reads ns's LockGrants as they are now,
// and ever after, as a replica's cache does while its watch delivers
// nothing; every other read and every write goes to the API server.
func pausedCache(t *testing.T, ns string) client.Client {
	t.Helper()
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	snapshot := list.DeepCopy()
	return interceptor.NewClient(env.Admin, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if grants, ok := l.(*lockingv1alpha1.LockGrantList); ok {
				snapshot.DeepCopyInto(grants)
				return nil
			}
			return c.List(ctx, l, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if g, ok := o.(*lockingv1alpha1.LockGrant); ok {
				for i := range snapshot.Items {
					if snapshot.Items[i].Namespace == key.Namespace && snapshot.Items[i].Name == key.Name {
						snapshot.Items[i].DeepCopyInto(g)
						return nil
					}
				}
				return apierrors.NewNotFound(lockingv1alpha1.GroupVersion.WithResource("lockgrants").GroupResource(), key.Name)
			}
			return c.Get(ctx, key, o, opts...)
		},
	})
}
