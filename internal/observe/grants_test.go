package observe

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func sample(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func grant(created time.Time, granted, ended *time.Time) *lockingv1alpha1.LockGrant {
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", CreationTimestamp: metav1.NewTime(created)}}
	g.Spec.Resource = "invoice-batch/1"
	if granted != nil {
		g.Status.GrantedAt = &metav1.MicroTime{Time: *granted}
	}
	if ended != nil {
		g.Status.EndedAt = &metav1.MicroTime{Time: *ended}
	}
	return g
}

// TestGrantObserver: a grant that queued behind a holder is counted once
// as a wait (creation to grant) and once as a handoff (the holder's end to
// the grant); renewals and other updates of a held grant count nothing.
func TestGrantObserver(t *testing.T) {
	o := &GrantObserver{ended: map[string]time.Time{}}
	t0 := time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)
	at := func(s float64) *time.Time { v := t0.Add(time.Duration(s * float64(time.Second))); return &v }
	waits, waitSum := sample(t, grantWait)
	handoffs, handoffSum := sample(t, grantHandoff)

	// A is granted at once, holds, and its lease ends at t=10.
	o.observe(grant(t0, nil, nil), grant(t0, at(0.5), nil))
	o.observe(grant(t0, at(0.5), nil), grant(t0, at(0.5), nil)) // a renewal: no change
	o.observe(grant(t0, at(0.5), nil), grant(t0, at(0.5), at(10)))
	// B queued at t=2 and is granted at t=10.25.
	o.observe(grant(*at(2), nil, nil), grant(*at(2), at(10.25), nil))

	n, sum := sample(t, grantWait)
	if n-waits != 2 || sum-waitSum < 8.74 || sum-waitSum > 8.76 {
		t.Errorf("waits: %d observations summing to %.3fs, want 2 summing to 8.75s (0.5 + 8.25)", n-waits, sum-waitSum)
	}
	n, sum = sample(t, grantHandoff)
	if n-handoffs != 1 || sum-handoffSum < 0.24 || sum-handoffSum > 0.26 {
		t.Errorf("handoffs: %d observations summing to %.3fs, want 1 of 0.25s", n-handoffs, sum-handoffSum)
	}

	// C arrives after the resource fell free: a wait, but no handoff.
	o.observe(grant(*at(10.25), at(10.25), nil), grant(*at(10.25), at(10.25), at(11)))
	o.observe(grant(*at(20), nil, nil), grant(*at(20), at(20.01), nil))
	if n, _ := sample(t, grantHandoff); n-handoffs != 1 {
		t.Errorf("a grant created after the resource fell free counted as a handoff")
	}
}
