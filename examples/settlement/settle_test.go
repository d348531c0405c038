package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/test/pgtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testCluster is the --cluster of the tests' workers.
const testCluster = "test-cluster"

// handover is a registry in which the first worker's grant is superseded
// by the second's after the first has written `after` segments.
type handover struct {
	mu       sync.Mutex
	reads    int
	after    int
	w1, w2   fencing.Grant
	resource string
}

func (h *handover) GrantFacts(_ context.Context, _ postgres.Key, uid string) (*fencing.Grant, *fencing.Counter, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reads++
	w1, w2 := h.w1, h.w2
	counter := &fencing.Counter{Fence: w1.Fence, HolderUID: w1.UID}
	if h.reads > h.after {
		// W1 froze past its lease; W2 was granted the next fence.
		w1.State = fencing.StateExpired
		counter = &fencing.Counter{Fence: w2.Fence, HolderUID: w2.UID}
	}
	switch uid {
	case w1.UID:
		return &w1, counter, nil
	case w2.UID:
		if h.reads > h.after {
			return &w2, counter, nil
		}
	}
	return nil, counter, nil
}

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := postgres.Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrate(t.Context(), db, postgres.Scope{Cluster: testCluster, Namespace: "billing"}, false); err != nil {
		t.Fatal(err)
	}
	return db
}

// A retry of a batch by a new owner, through the worker: W1 settles two segments and is superseded; its
// third segment is refused. W2 reruns the same batch: the first two
// segments are answered with W1's receipts, the rest are settled, and
// every invoice is settled exactly once.
func TestSettleRerunContinuesTheOperation(t *testing.T) {
	db := openDB(t)
	b, err := newBatch("2026-07-19", 10, 3) // segments of 3, 3, 3, 1
	if err != nil {
		t.Fatal(err)
	}
	far := time.Now().Add(time.Hour)
	reg := &handover{after: 2, resource: b.resource,
		w1: fencing.Grant{UID: "uid-w1", Resource: b.resource, Owner: "w1", State: fencing.StateHeld, Fence: 1, ExpiresAt: far},
		w2: fencing.Grant{UID: "uid-w2", Resource: b.resource, Owner: "w2", State: fencing.StateHeld, Fence: 2, ExpiresAt: far},
	}
	store := postgres.New(db, reg, postgres.WithCluster(testCluster))

	var out bytes.Buffer
	err = settle(t.Context(), store, holder{namespace: "billing", owner: "w1", uid: "uid-w1", fence: 1}, b, &out)
	if !errors.Is(err, fencing.ErrStaleOwner) {
		t.Fatalf("W1's settle = %v; want STALE_OWNER at segment 3\n%s", err, out.String())
	}
	out.Reset()
	if err := settle(t.Context(), store, holder{namespace: "billing", owner: "w2", uid: "uid-w2", fence: 2}, b, &out); err != nil {
		t.Fatalf("W2's settle: %v\n%s", err, out.String())
	}
	for _, line := range []string{"segment 1/4 already settled under fence 1", "segment 2/4 already settled under fence 1", "segment 3/4 settled", "segment 4/4 settled"} {
		if !strings.Contains(out.String(), line) {
			t.Fatalf("W2's report lacks %q:\n%s", line, out.String())
		}
	}

	rows, err := db.QueryContext(t.Context(), `SELECT segment, fence, count(*) FROM settlement_invoices GROUP BY segment, fence ORDER BY segment`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var seg, fence, n int64
		if err := rows.Scan(&seg, &fence, &n); err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.Join([]string{itoa(seg), itoa(fence), itoa(n)}, ":"))
	}
	want := "1:1:3 2:1:3 3:2:3 4:2:1" // segment:fence:invoices
	if strings.Join(got, " ") != want {
		t.Fatalf("settled invoices by segment:fence:count = %v; want %s", got, want)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func TestNewBatch(t *testing.T) {
	a, _ := newBatch("2026-07-19", 5, 2)
	b, _ := newBatch("2026-07-19", 5, 2)
	c, _ := newBatch("2026-07-20", 5, 2)
	if a.root != b.root || a.root == c.root || len(a.segments) != 3 || len(a.segments[2]) != 1 {
		t.Fatalf("batches: %+v %+v %+v", a, b, c)
	}
	if _, err := newBatch("Not/Valid", 5, 2); err == nil {
		t.Fatal("invalid resource accepted")
	}
}

// A database an earlier version of the worker wrote, when the store keyed
// its records by resource ID alone and invoices by invoice ID: the worker
// refuses to start (NO_RESOURCE) and changes nothing until it is told the
// records are its own cluster's and namespace's (--adopt-legacy-records);
// then the earlier run's receipts answer the rerun in that namespace.
func TestMigrateAdoptsAnEarlierVersionsRecords(t *testing.T) {
	db, err := postgres.Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	all, err := postgres.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	b, err := newBatch("2026-07-19", 2, 2) // one segment
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(b.segments[0])
	for _, stmt := range []string{
		`CREATE TABLE lockwarden_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		all[0].SQL,
		`INSERT INTO lockwarden_schema_migrations (version, name) VALUES (1, '` + all[0].Name + `')`,
		`CREATE TABLE settlement_invoices (invoice_id text PRIMARY KEY, batch text NOT NULL, amount_cents bigint NOT NULL,
			fence bigint NOT NULL, operation_root text NOT NULL, segment bigint NOT NULL, settled_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO settlement_invoices (invoice_id, batch, amount_cents, fence, operation_root, segment)
			SELECT 'INV-2026-07-19-000' || i, '2026-07-19', 100, 1, '` + b.root + `', 1 FROM generate_series(1, 2) i`,
		`INSERT INTO lockwarden_fences (resource, fence, grant_uid, root, last_seq) VALUES ('` + b.resource + `', 1, 'uid-w1', '` + b.root + `', 1)`,
		`INSERT INTO lockwarden_receipts (resource, root, seq, fence, grant_uid, digest, accepted_at)
			VALUES ('` + b.resource + `', '` + b.root + `', 1, 1, 'uid-w1', '` + fencing.PayloadDigest(payload) + `', now())`,
	} {
		if _, err := db.ExecContext(t.Context(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	scope := postgres.Scope{Cluster: testCluster, Namespace: "billing"}
	err = migrate(t.Context(), db, scope, false)
	if !errors.Is(err, fencing.ErrNoResource) || !strings.Contains(err.Error(), "--adopt-legacy-records") {
		t.Fatalf("migrate() without --adopt-legacy-records = %v; want NO_RESOURCE naming the flag", err)
	}
	var scoped bool
	if err := db.QueryRowContext(t.Context(), `SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name IN ('settlement_invoices', 'lockwarden_fences') AND column_name = 'namespace')`).Scan(&scoped); err != nil || scoped {
		t.Fatalf("a namespace column exists after the refused migration (%v); want nothing changed", err)
	}
	if err := migrate(t.Context(), db, scope, true); err != nil {
		t.Fatalf("migrate() with --adopt-legacy-records: %v", err)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT count(*) FROM settlement_invoices WHERE namespace = 'billing'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d invoices in namespace billing, %v; want the earlier run's 2", n, err)
	}
	far := time.Now().Add(time.Hour)
	w2 := fencing.Grant{UID: "uid-w2", Resource: b.resource, Owner: "w2", State: fencing.StateHeld, Fence: 2, ExpiresAt: far}
	store := postgres.New(db, postgres.RegistryFunc(func(context.Context, postgres.Key, string) (*fencing.Grant, *fencing.Counter, error) {
		return &w2, &fencing.Counter{Fence: 2, HolderUID: w2.UID}, nil
	}), postgres.WithCluster(testCluster))
	var out bytes.Buffer
	if err := settle(t.Context(), store, holder{namespace: "billing", owner: "w2", uid: "uid-w2", fence: 2}, b, &out); err != nil {
		t.Fatalf("rerun after the migration: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "segment 1/1 already settled under fence 1") {
		t.Fatalf("rerun after the migration did not find the earlier receipt:\n%s", out.String())
	}
}
