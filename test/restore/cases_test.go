package restore

import (
	"maps"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// On Kubernetes objects: A releases while its operation X is still
// writing; B writes its own operation Y; A's late segment 2 of X is refused
// STALE_OWNER, and X is visible as partially applied (segment 1 only, under
// A's fence), so that B can reconcile it.
func TestFastReleaseDuringMultiSegmentOperation(t *testing.T) {
	logManagerOnFailure(t)
	ctx := t.Context()
	ns := namespace(t, "c05-")
	const res = "invoice-batch/c05"
	a, b := as(t, "c05-a"), as(t, "c05-b")
	x := operation{ns: ns, name: "operation-x", resource: res}
	y := operation{ns: ns, name: "operation-y", resource: res}

	// t=0 ACQ R by A ttl=15; A starts X, segment 1 accepted.
	ga := held(t, a, ns, res, 15)
	if err := x.write(ctx, a, ga, 1, "x1"); err != nil {
		t.Fatalf("A's segment 1 of X: %v", err)
	}
	// t=6 A releases (graceful shutdown); t=6.1 ACQ R by B; B writes Y.
	release(t, a, ga)
	gb := held(t, b, ns, res, 15)
	if gb.Status.FenceToken <= ga.Status.FenceToken {
		t.Fatalf("B's fence %d is not above A's %d", gb.Status.FenceToken, ga.Status.FenceToken)
	}
	if err := y.write(ctx, b, gb, 1, "y1"); err != nil {
		t.Fatalf("B's segment 1 of Y: %v", err)
	}
	// t=6.5 A's segment 2 of X arrives.
	wantReason(t, "A's late segment 2 of X", x.write(ctx, a, ga, 2, "x2"), "STALE_OWNER")

	// X is visible as partially applied: segment 1 only, accepted under A's
	// grant and fence.
	cm := x.state(t)
	if cm == nil || !maps.Equal(cm.Data, map[string]string{"1": "x1"}) ||
		cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != fenceOf(ga) || cm.Annotations[lockingv1alpha1.AcceptedGrantAnnotation] != ga.Namespace+"/"+ga.Name {
		t.Fatalf("operation X = %+v; want segment 1 only, under A's grant %s and fence %s", cm, ga.Name, fenceOf(ga))
	}
	// B reconciles X: it continues the operation under its own fence.
	if err := x.write(ctx, b, gb, 2, "x2"); err != nil {
		t.Fatalf("B's segment 2 of X: %v", err)
	}
	if err := x.write(ctx, b, gb, 3, "x3"); err != nil {
		t.Fatalf("B's segment 3 of X: %v", err)
	}
	if cm := x.state(t); !maps.Equal(cm.Data, map[string]string{"1": "x1", "2": "x2", "3": "x3"}) || cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != fenceOf(gb) {
		t.Fatalf("operation X after B's reconcile = %v, fence %s; want segments 1..3, fence %s", cm.Data, cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation], fenceOf(gb))
	}
	if cm := y.state(t); !maps.Equal(cm.Data, map[string]string{"1": "y1"}) {
		t.Fatalf("operation Y = %v; want B's segment 1", cm.Data)
	}
}

// On Kubernetes objects: W2 retries operation P while W1's attempt is
// still running. What plays the role of the receipt is the stored object
// (see segments_test.go): W2's resend of segment 1 is answered with it,
// unchanged. W1's late segments are refused STALE_OWNER, a skipped segment
// SEQUENCE_GAP, a changed payload SEGMENT_CONFLICT; every segment takes
// effect exactly once.
func TestRetryWhileOriginalRuns(t *testing.T) {
	logManagerOnFailure(t)
	ctx := t.Context()
	ns := namespace(t, "c11-")
	const res = "invoice-batch/c11"
	w1, w2 := as(t, "c11-w1"), as(t, "c11-w2")
	p := operation{ns: ns, name: "operation-p", resource: res}

	// W1 holds R with a short lease and writes segment 1.
	g1 := held(t, w1, ns, res, 3)
	if err := p.write(ctx, w1, g1, 1, "invoices 1-10"); err != nil {
		t.Fatalf("W1's segment 1: %v", err)
	}
	r1 := p.state(t) // the receipt of segment 1

	// W1 freezes; its grant expires; W2, waiting in the queue, gets the
	// next fence for the same operation.
	g2 := acquire(t, w2, ns, res, 60)
	waitPhase(t, g1, lockingv1alpha1.PhaseExpired)
	g2 = waitPhase(t, g2, lockingv1alpha1.PhaseHeld)
	if g2.Status.FenceToken <= g1.Status.FenceToken {
		t.Fatalf("W2's fence %d is not above W1's %d", g2.Status.FenceToken, g1.Status.FenceToken)
	}

	// W2 resends segment 1 with the same payload: the API server answers
	// AlreadyExists, and the object W2 reads back is W1's receipt,
	// unchanged: no second effect.
	if err := p.write(ctx, w2, g2, 1, "invoices 1-10"); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("W2's resend of segment 1 = %v; want AlreadyExists, answered by the stored object", err)
	}
	if got := p.state(t); got.UID != r1.UID || got.ResourceVersion != r1.ResourceVersion || !maps.Equal(got.Data, r1.Data) {
		t.Fatalf("after W2's resend the operation is %s@%s %v; want W1's receipt %s@%s %v, unchanged",
			got.UID, got.ResourceVersion, got.Data, r1.UID, r1.ResourceVersion, r1.Data)
	}
	if err := p.write(ctx, w2, g2, 2, "invoices 11-20"); err != nil {
		t.Fatalf("W2's segment 2: %v", err)
	}

	// W1 wakes and sends segments 2 and 3 of the same operation under its
	// old fence.
	wantReason(t, "W1's late segment 2", p.write(ctx, w1, g1, 2, "invoices 11-20"), "STALE_OWNER")
	wantReason(t, "W1's late segment 3", p.write(ctx, w1, g1, 3, "invoices 21-30"), "STALE_OWNER")
	// W2 skips segment 3.
	wantReason(t, "W2's segment 4 before 3", p.write(ctx, w2, g2, 4, "invoices 31-40"), "SEQUENCE_GAP")
	// A resend of segment 2 with another payload is refused, never applied;
	// with the same payload it changes nothing.
	wantReason(t, "W2's segment 2 with another payload", p.write(ctx, w2, g2, 2, "invoices 11-20, amended"), "SEGMENT_CONFLICT")
	rv := p.state(t).ResourceVersion
	if err := p.write(ctx, w2, g2, 2, "invoices 11-20"); err != nil {
		t.Fatalf("W2's resend of segment 2: %v", err)
	}
	if got := p.state(t).ResourceVersion; got != rv {
		t.Fatalf("W2's identical resend of segment 2 wrote the object (resourceVersion %s -> %s)", rv, got)
	}

	if err := p.write(ctx, w2, g2, 3, "invoices 21-30"); err != nil {
		t.Fatalf("W2's segment 3: %v", err)
	}
	if err := p.write(ctx, w2, g2, 4, "invoices 31-40"); err != nil {
		t.Fatalf("W2's segment 4: %v", err)
	}
	got := p.state(t)
	want := map[string]string{"1": "invoices 1-10", "2": "invoices 11-20", "3": "invoices 21-30", "4": "invoices 31-40"}
	if !maps.Equal(got.Data, want) || got.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != fenceOf(g2) {
		t.Fatalf("operation P = %v under fence %s; want %v under W2's fence %s", got.Data, got.Annotations[lockingv1alpha1.AcceptedFenceAnnotation], want, fenceOf(g2))
	}
}
