package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/lockwarden/lockwarden/internal/test/pgtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// Workers starting together all migrate; the schema ends up applied once.
func TestMigrateConcurrentlyAndAgain(t *testing.T) {
	db, err := postgres.Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- postgres.Migrate(t.Context(), db) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := postgres.Migrate(t.Context(), db); err != nil {
		t.Fatalf("migrating a current schema: %v", err)
	}
	all, err := postgres.Migrations()
	if err != nil || len(all) == 0 {
		t.Fatalf("Migrations() = %v, %v", all, err)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM lockwarden_schema_migrations`).Scan(&n); err != nil || n != len(all) {
		t.Fatalf("applied migrations = %d, %v; want %d", n, err, len(all))
	}
}

// A resend returns the very receipt the first attempt got, and has no
// second effect.
func TestResendReturnsTheOriginalReceipt(t *testing.T) {
	e := newEnv(t)
	g := e.reg.acquire(key, "a", 10)
	e.reg.at(1)
	first := e.mustApply(segment(g, "P", 1, "p1"))
	if first.ID == "" || first.Fence != g.Fence || first.GrantUID != g.UID || first.Digest != fencing.PayloadDigest([]byte("p1")) || !first.AcceptedAt.Equal(e.reg.clk.Now()) {
		t.Fatalf("receipt = %+v", first)
	}
	e.reg.at(2)
	res, err := e.apply(segment(g, "P", 1, "p1"))
	if err != nil || res.Applied || res.Receipt != first {
		t.Fatalf("resend = %+v, %v; want the original receipt %+v", res, err, first)
	}
	if _, counts := e.effects(key); counts["P/1"] != 1 {
		t.Fatalf("effects = %v; want P/1 once", counts)
	}
	if l := e.ledger(key); l != (fencing.Ledger{Fence: g.Fence, GrantUID: g.UID, Root: "P", LastSeq: 1}) {
		t.Fatalf("ledger = %+v", l)
	}
}

// A mutation that fails leaves nothing behind: no receipt, no fence, and
// the segment can be sent again.
func TestFailedMutationRecordsNothing(t *testing.T) {
	e := newEnv(t)
	g := e.reg.acquire(key, "a", 10)
	boom := errors.New("boom")
	_, err := e.store.Apply(t.Context(), segment(g, "P", 1, "p1"), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ('x', 'x', 'x', 1, 1, '')`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Apply() error = %v; want the mutation's error", err)
	}
	if l := e.ledger(key); l != (fencing.Ledger{}) {
		t.Fatalf("ledger after a failed mutation = %+v; want none", l)
	}
	if _, counts := e.effects(postgres.Key{Namespace: "x", Resource: "x"}); len(counts) != 0 {
		t.Fatalf("the failed mutation's own change survived: %v", counts)
	}
	e.mustApply(segment(g, "P", 1, "p1"))
}

// A registry that cannot answer applies nothing.
func TestRegistryErrorAppliesNothing(t *testing.T) {
	e := newEnv(t)
	down := errors.New("registry down")
	s := postgres.New(e.db, postgres.RegistryFunc(func(context.Context, postgres.Key, string) (*fencing.Grant, *fencing.Counter, error) {
		return nil, nil, down
	}), postgres.WithCluster(cluster))
	g := e.reg.acquire(key, "a", 10)
	if _, err := s.Apply(t.Context(), segment(g, "P", 1, "p1"), effect(segment(g, "P", 1, "p1"))); !errors.Is(err, down) || fencing.ReasonOf(err) != "" {
		t.Fatalf("Apply() error = %v; want the registry's error, not a refusal", err)
	}
	if _, counts := e.effects(key); len(counts) != 0 {
		t.Fatalf("effects = %v; want none", counts)
	}
}

// Parallel writers on one resource: grants are issued while earlier
// holders are still writing, and every segment is sent twice at once. The
// accepted fences never decrease, each segment takes effect once, every
// operation is a prefix 1..n, and every resend gets the applied receipt.
func TestParallelWriters(t *testing.T) {
	e := newEnv(t)
	const writers, segments = 8, 5
	type outcome struct {
		seg postgres.Segment
		res postgres.Result
		err error
	}
	out := make(chan outcome, writers*segments*2)
	var wg sync.WaitGroup
	for w := range writers {
		g := e.reg.acquire(key, fmt.Sprintf("w%d", w), 60)
		// The next grant is issued once this writer's first segment is
		// decided, while the rest of its operation races the successor.
		started := make(chan struct{})
		wg.Go(func() {
			root := fmt.Sprintf("op-%d", w)
			for seq := int64(1); seq <= segments; seq++ {
				if seq == 2 {
					close(started)
				}
				seg := segment(g, root, seq, fmt.Sprintf("%s/%d", root, seq))
				var pair sync.WaitGroup
				refused := false
				var mu sync.Mutex
				for range 2 {
					pair.Go(func() {
						res, err := e.apply(seg)
						out <- outcome{seg, res, err}
						if err != nil {
							mu.Lock()
							refused = true
							mu.Unlock()
						}
					})
				}
				pair.Wait()
				if refused {
					if seq == 1 {
						close(started)
					}
					return
				}
			}
		})
		<-started
	}
	wg.Wait()
	close(out)

	applied := map[string]fencing.Receipt{}
	var resends []outcome
	for o := range out {
		k := fmt.Sprintf("%s/%d", o.seg.Root, o.seg.Seq)
		switch {
		case o.err != nil:
			var r *postgres.Refusal
			if !errors.As(o.err, &r) {
				t.Fatalf("segment %s: %v; want a refusal", k, o.err)
			}
		case o.res.Applied:
			if _, dup := applied[k]; dup {
				t.Fatalf("segment %s applied twice", k)
			}
			applied[k] = o.res.Receipt
		default:
			resends = append(resends, o)
		}
	}
	for _, o := range resends {
		k := fmt.Sprintf("%s/%d", o.seg.Root, o.seg.Seq)
		if r, ok := applied[k]; !ok || r != o.res.Receipt {
			t.Fatalf("resend of %s got receipt %+v; want the applied one %+v", k, o.res.Receipt, r)
		}
	}

	t.Logf("%d segments applied, %d resends answered with their receipt", len(applied), len(resends))

	// The resource's own record agrees.
	rows, err := e.db.QueryContext(t.Context(), `SELECT root, seq, fence FROM lockwarden_receipts WHERE resource = $1 ORDER BY accepted_order`, resource)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var last int64
	lastSeq := map[string]int64{}
	n := 0
	for rows.Next() {
		var root string
		var seq, fence int64
		if err := rows.Scan(&root, &seq, &fence); err != nil {
			t.Fatal(err)
		}
		if fence < last {
			t.Fatalf("fence %d accepted after fence %d", fence, last)
		}
		if seq != lastSeq[root]+1 {
			t.Fatalf("operation %s: segment %d accepted after segment %d", root, seq, lastSeq[root])
		}
		last, lastSeq[root] = fence, seq
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	_, counts := e.effects(key)
	if n != len(applied) || len(counts) != len(applied) {
		t.Fatalf("%d receipts, %d segments with effects, %d applied results; want equal", n, len(counts), len(applied))
	}
	for k, c := range counts {
		if c != 1 {
			t.Fatalf("segment %s took effect %d times", k, c)
		}
	}
	if l := e.ledger(key); l.Fence != last {
		t.Fatalf("ledger fence %d; want the last accepted %d", l.Fence, last)
	}
	// The last grant was never superseded: it wrote its whole operation.
	if lastSeq[fmt.Sprintf("op-%d", writers-1)] != segments {
		t.Fatalf("the current holder's operation stopped at segment %d", lastSeq[fmt.Sprintf("op-%d", writers-1)])
	}
}

// Writers of different resources do not see each other's fences.
func TestResourcesAreIndependent(t *testing.T) {
	e := newEnv(t)
	a := e.reg.acquire(postgres.Key{Namespace: namespace, Resource: "res/a"}, "a", 10)
	a2 := e.reg.acquire(postgres.Key{Namespace: namespace, Resource: "res/a"}, "a", 10)
	b := e.reg.acquire(postgres.Key{Namespace: namespace, Resource: "res/b"}, "b", 10)
	e.mustApply(segment(a2, "A", 1, "a"))
	e.mustApply(segment(b, "B", 1, "b"))
	e.wantRefused(segment(a, "A0", 1, "a0"), fencing.ReasonStaleOwner)
	if la, lb := e.ledger(postgres.Key{Namespace: namespace, Resource: "res/a"}), e.ledger(postgres.Key{Namespace: namespace, Resource: "res/b"}); la.Fence != 2 || lb.Fence != 1 {
		t.Fatalf("ledgers = %+v, %+v; want fences 2 and 1", la, lb)
	}
}

// Segments computed concurrently under one grant are accepted only in
// order: a segment that arrives early is refused SEQUENCE_GAP and is
// accepted once its predecessor is.
func TestConcurrentSegmentsAcceptedInOrder(t *testing.T) {
	e := newEnv(t)
	g := e.reg.acquire(key, "a", 60)
	const segments = 8
	var wg sync.WaitGroup
	gaps := make([]int, segments+1)
	for seq := int64(1); seq <= segments; seq++ {
		wg.Go(func() {
			seg := segment(g, "P", seq, fmt.Sprint(seq))
			for range 10_000 {
				_, err := e.apply(seg)
				if err == nil {
					return
				}
				if !errors.Is(err, fencing.ErrSequenceGap) {
					t.Errorf("segment %d: %v", seq, err)
					return
				}
				gaps[seq]++
			}
			t.Errorf("segment %d never accepted", seq)
		})
	}
	wg.Wait()
	receipts, err := e.store.Receipts(t.Context(), key, "P")
	if err != nil {
		t.Fatal(err)
	}
	if len(receipts) != segments {
		t.Fatalf("%d receipts, want %d", len(receipts), segments)
	}
	for i := 1; i < len(receipts); i++ {
		if receipts[i].AcceptedAt.Before(receipts[i-1].AcceptedAt) || receipts[i].Seq != int64(i+1) {
			t.Fatalf("receipts out of order: %+v", receipts)
		}
	}
	t.Logf("early arrivals refused SEQUENCE_GAP, by segment: %v", gaps[1:])
}
