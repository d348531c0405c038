package lockgrant

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// leases is a reader of a fixed list of replica Leases.
type leases []coordinationv1.Lease

func (l leases) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return nil
}

func (l leases) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	list.(*coordinationv1.LeaseList).Items = append([]coordinationv1.Lease(nil), l...)
	return nil
}

func replicaLease(id string, renewed time.Time) coordinationv1.Lease {
	t := metav1.NewMicroTime(renewed)
	return coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: ReplicaLeasePrefix + id},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(id), LeaseDurationSeconds: ptr.To(int32(2)), RenewTime: &t},
	}
}

// A peer's Lease renewed ahead of this replica's clock still counts the
// peer live (as renewed now), and it is not silent: the metric shows the
// lead, and a lead beyond the clock-skew bound is logged, once a minute
// per peer.
func TestPeerLeaseRenewedAheadIsReported(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	var logged []string
	ctx := logf.IntoContext(t.Context(), funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{}))
	o := &Ownership{ID: "self", Clock: clk, MaxLeaseDuration: 2 * time.Second}
	check := func(ahead time.Duration) []string {
		t.Helper()
		o.Members = leases{replicaLease("peer", clk.Now().Add(ahead))}
		live, err := o.live(ctx, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		var m dto.Metric
		if err := leaseAhead.Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(m.GetGauge().GetValue() * float64(time.Second)); got != max(ahead, 0) {
			t.Fatalf("lockwarden_replica_lease_ahead_seconds is %s, the Lease is %s ahead", got, ahead)
		}
		return live
	}

	if live := check(800 * time.Millisecond); len(live) != 2 {
		t.Fatalf("a peer renewed 800ms ahead is not live: %v", live)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], `"replica"="peer"`) || !strings.Contains(logged[0], `"ahead"="800ms"`) {
		t.Fatalf("a Lease 800ms ahead was logged as %q", logged)
	}
	check(900 * time.Millisecond)
	if len(logged) != 1 {
		t.Fatalf("logged again within a minute: %q", logged)
	}
	clk.Step(time.Minute)
	check(100 * time.Millisecond)
	if len(logged) != 1 {
		t.Fatalf("a lead within the clock-skew bound was logged: %q", logged)
	}
	check(0)
}
