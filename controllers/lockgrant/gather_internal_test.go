package lockgrant

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// steps records, in order, the clock reads and the grant reads of a pass.
type steps struct{ log []string }

// stepClock is a clock whose reads are recorded.
type stepClock struct {
	*clocktesting.FakePassiveClock
	s *steps
}

func (c stepClock) Now() time.Time {
	c.s.log = append(c.s.log, "clock")
	return c.FakePassiveClock.Now()
}

// stepReader is a client whose List calls are recorded.
type stepReader struct {
	client.Client
	s *steps
}

func (c stepReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.s.log = append(c.s.log, "grants")
	return c.Client.List(ctx, list, opts...)
}

// A pass reads the controller's clock only after the grants it decides
// on: a lease it starts or extends at Now then never starts before the
// create or renew it answers was sent, which is the instant the holder
// counts its deadline from. Read the other way round, a pause between the
// clock and the grants (a GC pause, a frozen replica) would let a renew
// sent during the pause be answered with a lease that ends before the
// holder's deadline.
func TestGatherReadsTheClockAfterTheGrants(t *testing.T) {
	scheme := runtime.NewScheme()
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithIndex(&lockingv1alpha1.LockGrant{}, CounterNameField, func(o client.Object) []string {
			return []string{lockingv1alpha1.FenceCounterName(o.(*lockingv1alpha1.LockGrant).Spec.Resource)}
		}).Build()
	s := &steps{}
	r := &Reconciler{Client: stepReader{Client: c, s: s}, APIReader: c, Clock: stepClock{clocktesting.NewFakePassiveClock(time.Now()), s}}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "billing", Name: lockingv1alpha1.FenceCounterName("invoice-batch/1")}}
	if _, err := r.gather(t.Context(), req, c); err != nil {
		t.Fatal(err)
	}
	if len(s.log) < 2 || s.log[0] != "grants" || s.log[1] != "clock" {
		t.Fatalf("a pass read %v; want the grants first, then the clock", s.log)
	}
}
