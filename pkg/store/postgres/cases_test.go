package postgres_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// A retry runs while the original attempt is still running. Every
// segment takes effect exactly once, with the payload first accepted.
func TestRetryWhileOriginalRuns(t *testing.T) {
	e := newEnv(t)
	e.reg.at(0)
	w1 := e.reg.acquire(key, "w1", 10)
	r1 := e.mustApply(segment(w1, "P", 1, "invoices 1-10"))

	// W1 freezes; its grant expires; W2 gets fence 2 for the same operation.
	e.reg.at(10)
	e.reg.end(w1.UID, fencing.StateExpired)
	e.reg.at(11)
	w2 := e.reg.acquire(key, "w2", 10)

	res, err := e.apply(segment(w2, "P", 1, "invoices 1-10"))
	if err != nil || res.Applied || res.Receipt != r1 {
		t.Fatalf("W2's resend of segment 1 = %+v, %v; want W1's receipt %+v and no effect", res, err, r1)
	}
	r2 := e.mustApply(segment(w2, "P", 2, "invoices 11-20"))

	// W1 wakes and sends segments 2 and 3 under fence 1.
	e.wantRefused(segment(w1, "P", 2, "invoices 11-20 (W1)"), fencing.ReasonStaleOwner)
	e.wantRefused(segment(w1, "P", 3, "invoices 21-30 (W1)"), fencing.ReasonStaleOwner)
	// W2 skips segment 3.
	e.wantRefused(segment(w2, "P", 4, "invoices 31-40"), fencing.ReasonSequenceGap)
	// A resend of segment 2 with another payload is quarantined.
	r := e.wantRefused(segment(w2, "P", 2, "invoices 11-20, amended"), fencing.ReasonSegmentConflict)
	if !r.Quarantined || r.Ledger.Fence != 2 {
		t.Fatalf("conflict refusal = %+v; want quarantined with the ledger at fence 2", r)
	}
	q, err := e.store.Quarantine(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(q) != 1 || string(q[0].Payload) != "invoices 11-20, amended" || q[0].ConflictsWith != r2.ID || q[0].Seq != 2 {
		t.Fatalf("quarantine = %+v; want the amended payload of segment 2, against receipt %s", q, r2.ID)
	}
	// The same conflicting payload again is counted, not stored twice.
	e.wantRefused(segment(w2, "P", 2, "invoices 11-20, amended"), fencing.ReasonSegmentConflict)
	if q, _ := e.store.Quarantine(t.Context(), key); len(q) != 1 || q[0].Attempts != 2 {
		t.Fatalf("quarantine after a second conflict = %+v; want one row, 2 attempts", q)
	}

	e.mustApply(segment(w2, "P", 3, "invoices 21-30"))
	e.mustApply(segment(w2, "P", 4, "invoices 31-40"))

	payloads, counts := e.effects(key)
	want := map[string]string{"P/1": "invoices 1-10", "P/2": "invoices 11-20", "P/3": "invoices 21-30", "P/4": "invoices 31-40"}
	if !maps.Equal(payloads, want) {
		t.Fatalf("effects = %v, want %v", payloads, want)
	}
	for k, n := range counts {
		if n != 1 {
			t.Fatalf("segment %s took effect %d times", k, n)
		}
	}
	receipts, err := e.store.Receipts(t.Context(), key, "P")
	if err != nil {
		t.Fatal(err)
	}
	if len(receipts) != 4 || receipts[0] != r1 || receipts[0].Fence != 1 || receipts[1].Fence != 2 {
		t.Fatalf("receipts of P = %+v; want 4, segment 1 under fence 1 and the rest under fence 2", receipts)
	}
}

// A releases while its operation X is still writing; B writes its
// own operation Y; A's late segment is refused, and X is visible as
// partially applied so that B can reconcile it.
func TestFastReleaseDuringMultiSegmentOperation(t *testing.T) {
	e := newEnv(t)
	e.reg.at(0)
	a := e.reg.acquire(key, "a", 15)
	e.mustApply(segment(a, "X", 1, "x1"))
	e.reg.at(6)
	e.reg.end(a.UID, fencing.StateReleased)
	e.reg.at(6.1)
	b := e.reg.acquire(key, "b", 15)
	e.mustApply(segment(b, "Y", 1, "y1"))
	e.reg.at(6.5)
	e.wantRefused(segment(a, "X", 2, "x2"), fencing.ReasonStaleOwner)

	// B reconciles X: segment 1 took effect, segment 2 never will.
	receipts, err := e.store.Receipts(t.Context(), key, "X")
	if err != nil {
		t.Fatal(err)
	}
	if len(receipts) != 1 || receipts[0].Seq != 1 {
		t.Fatalf("receipts of X = %+v; want segment 1 only", receipts)
	}
	for seq, want := range map[int64]fencing.MutationState{1: fencing.MutationApplied, 2: fencing.MutationAbsent} {
		got, err := e.store.Lookup(t.Context(), key, "X", seq, a.Fence)
		if err != nil || got.State != want {
			t.Fatalf("Lookup(X, %d) = %+v, %v; want %v", seq, got, err, want)
		}
	}
	if _, counts := e.effects(key); len(counts) != 2 || counts["X/1"] != 1 || counts["Y/1"] != 1 {
		t.Fatalf("effects = %v; want X/1 and Y/1 once each", counts)
	}
}

// The registry is restored from an old snapshot and issues a fence
// again. The store refuses FENCE_REGRESSION, keeps its highest fence, and
// raises the alarm (alarm row, metric, hook). A fence of a later issuer
// epoch resumes traffic without anyone clearing the recorded fence.
func TestRegistryRestoredFromOldSnapshot(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics, err := postgres.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var (
		hookMu sync.Mutex
		hooked []fencing.Segment
	)
	e := newEnv(t, postgres.WithMetrics(metrics), postgres.WithRegressionHook(func(_ context.Context, r *postgres.Refusal) {
		hookMu.Lock()
		defer hookMu.Unlock()
		hooked = append(hooked, r.Segment)
	}))

	g1 := e.reg.acquire(key, "a", 10)
	e.mustApply(segment(g1, "op-1", 1, "1"))
	g2 := e.reg.acquire(key, "b", 10)
	e.mustApply(segment(g2, "op-2", 1, "2"))
	counters, grants := e.reg.snapshot() // fence 2, g2 Held
	g3 := e.reg.acquire(key, "c", 10)
	e.mustApply(segment(g3, "op-3", 1, "3"))
	before := e.ledger(key)
	e.reg.restore(counters, grants)

	// The grant held at the snapshot is current again in the registry.
	e.wantRefused(segment(g2, "op-2", 2, "2b"), fencing.ReasonFenceRegression)
	// The next grant gets fence 3 again, from another grant.
	g3again := e.reg.acquire(key, "d", 10)
	if g3again.Fence != g3.Fence {
		t.Fatalf("restored registry issued fence %d, want %d again", g3again.Fence, g3.Fence)
	}
	r := e.wantRefused(segment(g3again, "op-4", 1, "4"), fencing.ReasonFenceRegression)
	if !errors.Is(r, fencing.ErrFenceRegression) || r.Ledger != before {
		t.Fatalf("refusal = %+v; want FENCE_REGRESSION with the ledger %+v", r, before)
	}
	if got := e.ledger(key); got != before {
		t.Fatalf("ledger after regressions = %+v; want it unchanged %+v", got, before)
	}

	// The alarm: recorded, counted, handed to the hook.
	alarms, err := e.store.Alarms(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(alarms) != 2 || alarms[0].GrantUID != g2.UID || alarms[1].GrantUID != g3again.UID || alarms[1].Highest != (fencing.Ledger{Fence: 3, GrantUID: g3.UID, Root: "op-3"}) {
		t.Fatalf("alarms = %+v; want one for %s and one for %s against fence 3 of %s", alarms, g2.UID, g3again.UID, g3.UID)
	}
	if n := counterValue(t, reg, "lockwarden_store_fence_regressions_total"); n != 2 {
		t.Fatalf("lockwarden_store_fence_regressions_total = %v, want 2", n)
	}
	hookMu.Lock()
	if len(hooked) != 2 || hooked[1].GrantUID != g3again.UID {
		t.Fatalf("regression hook saw %+v; want both refusals", hooked)
	}
	hookMu.Unlock()

	// Nobody can lower or clear the recorded fence to let traffic through.
	for _, stmt := range []string{
		`UPDATE lockwarden_fences SET fence = 2 WHERE resource = '` + resource + `'`,
		`DELETE FROM lockwarden_fences WHERE resource = '` + resource + `'`,
		`TRUNCATE lockwarden_fences CASCADE`,
		`DELETE FROM lockwarden_receipts`,
	} {
		if _, err := e.db.ExecContext(t.Context(), stmt); err == nil {
			t.Fatalf("%s succeeded; want it refused", stmt)
		}
	}
	if got := e.ledger(key); got != before {
		t.Fatalf("ledger = %+v; want %+v", got, before)
	}

	// Recovery: the operator bumps the issuer epoch.
	e.reg.bumpEpoch()
	g4 := e.reg.acquire(key, "e", 10)
	e.mustApply(segment(g4, "op-5", 1, "5"))
	if got := e.ledger(key); got.Fence != 1<<fencing.EpochBits|1 {
		t.Fatalf("ledger after the epoch bump = %+v; want fence %d", got, int64(1<<fencing.EpochBits|1))
	}
	if n := counterValue(t, reg, "lockwarden_store_segments_total"); n != 6 {
		t.Fatalf("lockwarden_store_segments_total = %v, want 6 decisions (4 applied, 2 refused)", n)
	}
}

// counterValue sums every series of the named counter.
func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
