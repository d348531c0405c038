package integration

import (
	"context"
	"math"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// issuerEpoch is the FenceIssuer's current epoch, once the manager has
// created it and published its trust bundle.
func issuerEpoch(t *testing.T) int64 {
	t.Helper()
	iss := &lockingv1alpha1.FenceIssuer{}
	waitUntil(t, "the FenceIssuer is ready", func() (bool, error) {
		if err := admin.Get(t.Context(), client.ObjectKey{Name: lockingv1alpha1.DefaultFenceIssuerName}, iss); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return meta.IsStatusConditionTrue(iss.Status.Conditions, "Ready"), nil
	})
	return iss.Spec.Epoch
}

// raiseCounter is an operator creating resource's FenceCounter in ns with
// fence, as one raises a counter by hand.
func raiseCounter(t *testing.T, ns, res string, fence int64) {
	t.Helper()
	c := &lockingv1alpha1.FenceCounter{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(res)},
		Spec:       lockingv1alpha1.FenceCounterSpec{Resource: res, Fence: fence},
	}
	if err := admin.Create(t.Context(), c); err != nil {
		t.Fatalf("raising the counter of %s to %d: %v", res, fence, err)
	}
	// A raised counter counts for hack/next-epoch.sh across the whole
	// cluster, and the suite shares one API server: retire it the only way
	// the webhook lets anyone, by deleting its namespace first.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
			return
		}
		if err := admin.Delete(ctx, c); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("retiring the raised counter of %s: %v", res, err)
		}
	})
}

// waitHeldBack waits until the waiting grant g is told, in its Ready
// condition, that it is held back for reason, with a message that says
// what to do, and returns it. The grant must stay Pending, without a fence.
func waitHeldBack(t *testing.T, g *lockingv1alpha1.LockGrant, reason, says string) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := waitFor(t, g, "held back with reason "+reason, func(g *lockingv1alpha1.LockGrant) bool {
		c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady)
		return c != nil && c.Reason == reason || g.Status.Phase != lockingv1alpha1.PhasePending && g.Status.Phase != ""
	})
	c := meta.FindStatusCondition(cur.Status.Conditions, lockingv1alpha1.ConditionReady)
	if cur.Status.Phase != lockingv1alpha1.PhasePending || cur.Status.FenceToken != 0 || c == nil || c.Reason != reason || !strings.Contains(c.Message, says) {
		t.Fatalf("grant %s: phase %s, fence %d, Ready %+v; want Pending without a fence, reason %s saying %q",
			g.Name, cur.Status.Phase, cur.Status.FenceToken, c, reason, says)
	}
	return cur
}

// waitEvent waits for a Warning Event with reason in namespace ns (the
// namespace "default" for a cluster-scoped object) regarding an object of
// kind named name, whose note contains says.
func waitEvent(t *testing.T, ns, kind, name, reason, says string) {
	t.Helper()
	waitUntil(t, "a "+reason+" Event regarding "+kind+" "+name, func() (bool, error) {
		var evs eventsv1.EventList
		if err := admin.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.Regarding.Kind == kind && e.Regarding.Name == name && e.Type == "Warning" && strings.Contains(e.Note, says) {
				return true, nil
			}
		}
		return false, nil
	})
}

// A counter raised into a later epoch than the issuer's, or to the very
// last fence: the next request is never issued a fence whose epoch bits
// are not the issuer's, nor left waiting as Pending without a word. It is
// told why and what to do, and so is the FenceIssuer.
func TestGrantHeldBackWhenTheEpochHasNoFence(t *testing.T) {
	epoch := issuerEpoch(t)
	for _, tc := range []struct {
		name, res string
		counter   int64
		says      string
	}{
		{"a counter of a later epoch", "raised/later-epoch", (epoch+5)<<fencing.EpochBits | 3, "spec.epoch to " + fencing.FormatFence(epoch+5) + " or more"},
		{"the int64 end", "raised/int64-end", math.MaxInt64, "use another resource ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			raiseCounter(t, ns, tc.res, tc.counter)
			b, err := acquire(t, as(t, "held-back-b"), ns, 30, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = tc.res })
			if err != nil {
				t.Fatal(err)
			}
			waitHeldBack(t, b, lockingv1alpha1.LockGrantReasonEpochBehind, tc.says)
			waitEvent(t, ns, "LockGrant", b.Name, lockingv1alpha1.LockGrantReasonEpochBehind, tc.says)
			waitEvent(t, metav1.NamespaceDefault, "FenceIssuer", lockingv1alpha1.DefaultFenceIssuerName, lockingv1alpha1.LockGrantReasonEpochBehind, b.Name)
			if c := counterIn(t, ns, tc.res); c.Spec.Fence != tc.counter || c.Spec.Holder != nil {
				t.Fatalf("counter %+v after the held-back request; want it untouched at %d", c.Spec, tc.counter)
			}
		})
	}
}
