package postgres_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockwarden/lockwarden/internal/test/pgtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// The settlement worker run in namespace default, then in namespace
// billing, on one database: the same resource ID, fences issued by two
// FenceCounters. Keyed by resource ID alone, billing's fence 1 met
// default's fence 2 and was refused as a FENCE_REGRESSION (alarm row,
// metric, hook). Keyed by namespace too, both are accepted and each
// namespace has its own ledger and receipts.
func TestSameResourceIDInTwoNamespacesIsNoRegression(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics, err := postgres.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var hooked atomic.Int32
	e := newEnv(t, postgres.WithMetrics(metrics), postgres.WithRegressionHook(func(context.Context, *postgres.Refusal) { hooked.Add(1) }))
	inDefault := postgres.Key{Namespace: "default", Resource: resource}
	inBilling := postgres.Key{Namespace: "billing", Resource: resource}

	// namespace default: two runs, fences 1 and 2, the same operation.
	d1 := e.reg.acquire(inDefault, "settlement", 60)
	first := e.mustApply(segment(d1, "batch", 1, "invoices 1-4"))
	d2 := e.reg.acquire(inDefault, "settlement", 60)
	if res, err := e.apply(segment(d2, "batch", 1, "invoices 1-4")); err != nil || res.Applied || res.Receipt != first {
		t.Fatalf("default's second run, segment 1 = %+v, %v; want the first run's receipt", res, err)
	}
	e.mustApply(segment(d2, "batch", 2, "invoices 5-8"))

	// namespace billing: its own counter issues fence 1 for the same ID,
	// and the same batch has the same operation root.
	b1 := e.reg.acquire(inBilling, "settlement", 60)
	if b1.Fence != 1 || d2.Fence != 2 {
		t.Fatalf("fences: billing %d, default %d; want 1 and 2", b1.Fence, d2.Fence)
	}
	billingFirst := e.mustApply(segment(b1, "batch", 1, "invoices 1-4"))
	if billingFirst.ID == first.ID {
		t.Fatalf("billing's segment 1 was answered with default's receipt %s", first.ID)
	}
	e.mustApply(segment(b1, "batch", 2, "invoices 5-8"))

	if got, want := e.ledger(inDefault), (fencing.Ledger{Fence: 2, GrantUID: d2.UID, Root: "batch", LastSeq: 2}); got != want {
		t.Fatalf("default's ledger = %+v; want %+v", got, want)
	}
	if got, want := e.ledger(inBilling), (fencing.Ledger{Fence: 1, GrantUID: b1.UID, Root: "batch", LastSeq: 2}); got != want {
		t.Fatalf("billing's ledger = %+v; want %+v", got, want)
	}
	for _, k := range []postgres.Key{inDefault, inBilling} {
		alarms, err := e.store.Alarms(t.Context(), k)
		if err != nil || len(alarms) != 0 {
			t.Fatalf("alarms of %s = %+v, %v; want none", k, alarms, err)
		}
		receipts, err := e.store.Receipts(t.Context(), k, "batch")
		if err != nil || len(receipts) != 2 {
			t.Fatalf("receipts of %s = %+v, %v; want segments 1 and 2", k, receipts, err)
		}
		if _, counts := e.effects(k); len(counts) != 2 || counts["batch/1"] != 1 || counts["batch/2"] != 1 {
			t.Fatalf("effects in %s = %v; want each segment once", k, counts)
		}
	}
	if n := counterValue(t, reg, "lockwarden_store_fence_regressions_total"); n != 0 || hooked.Load() != 0 {
		t.Fatalf("regressions counted %v, hooked %d; want none", n, hooked.Load())
	}

	// The namespaces stay fenced apart: default's stale fence 1 is still
	// refused in default, and billing cannot present default's grant.
	e.wantRefused(segment(d1, "batch", 3, "late"), fencing.ReasonStaleOwner)
	stolen := segment(d2, "batch", 3, "invoices 9-12")
	stolen.Namespace = "billing"
	e.wantRefused(stolen, fencing.ReasonUnknownGrant)
	if got := e.ledger(inBilling); got.Fence != 1 || got.LastSeq != 2 {
		t.Fatalf("billing's ledger after refusals = %+v; want it unchanged", got)
	}
}

// Two clusters (two lockwarden installations) issue fences for the same
// namespace and resource ID independently; on one database each has its
// own ledger, and a regression in one is still caught there.
func TestClustersAreIndependent(t *testing.T) {
	e := newEnv(t)
	east, west := e.reg, newRegistry()
	eastStore := e.store
	westStore := postgres.New(e.db, west, postgres.WithCluster("west"), postgres.WithClock(west.clk))
	apply := func(s *postgres.Store, seg postgres.Segment) (postgres.Result, error) {
		return s.Apply(t.Context(), seg, effect(seg))
	}

	e1 := east.acquire(key, "a", 60)
	e.mustApply(segment(e1, "op-east-1", 1, "e1"))
	counters, grants := east.snapshot()
	e2 := east.acquire(key, "b", 60)
	e.mustApply(segment(e2, "op-east-2", 1, "e2"))

	w1 := west.acquire(key, "a", 60)
	if res, err := apply(westStore, segment(w1, "op-west", 1, "w1")); err != nil || !res.Applied {
		t.Fatalf("west's fence 1 after east's fence 2 = %+v, %v; want applied", res, err)
	}
	eastLedger, err := eastStore.Ledger(t.Context(), key)
	if err != nil || eastLedger.Fence != 2 || eastLedger.GrantUID != e2.UID {
		t.Fatalf("east's ledger = %+v, %v; want fence 2 of %s", eastLedger, err, e2.UID)
	}
	westLedger, err := westStore.Ledger(t.Context(), key)
	if err != nil || westLedger != (fencing.Ledger{Fence: 1, GrantUID: w1.UID, Root: "op-west", LastSeq: 1}) {
		t.Fatalf("west's ledger = %+v, %v; want fence 1 of %s", westLedger, err, w1.UID)
	}

	// East's registry is restored from its snapshot and issues fence 2
	// again: refused in east, and west is not affected.
	east.restore(counters, grants)
	again := east.acquire(key, "c", 60)
	e.wantRefused(segment(again, "op-east-3", 1, "e3"), fencing.ReasonFenceRegression)
	alarms, err := eastStore.Alarms(t.Context(), key)
	if err != nil || len(alarms) != 1 || alarms[0].Scope != (postgres.Scope{Cluster: cluster, Namespace: namespace}) {
		t.Fatalf("east's alarms = %+v, %v; want one in cluster %s", alarms, err, cluster)
	}
	if alarms, err := westStore.Alarms(t.Context(), key); err != nil || len(alarms) != 0 {
		t.Fatalf("west's alarms = %+v, %v; want none", alarms, err)
	}
	w2 := west.acquire(key, "b", 60)
	if res, err := apply(westStore, segment(w2, "op-west", 1, "w1")); err != nil || res.Applied {
		t.Fatalf("west's rerun under fence 2 = %+v, %v; want its receipt", res, err)
	}
}

// A store without a cluster, or a segment without a namespace or resource,
// is refused NO_RESOURCE and records nothing.
func TestScopeIsRequired(t *testing.T) {
	e := newEnv(t)
	g := e.reg.acquire(key, "a", 60)
	unnamed := postgres.New(e.db, e.reg, postgres.WithClock(e.reg.clk))
	noNamespace := segment(g, "P", 1, "p1")
	noNamespace.Namespace = ""
	noResource := segment(g, "P", 1, "p1")
	noResource.Resource = ""
	for name, try := range map[string]func() error{
		"apply on a store without a cluster": func() error {
			_, err := unnamed.Apply(t.Context(), segment(g, "P", 1, "p1"), effect(segment(g, "P", 1, "p1")))
			return err
		},
		"lookup on a store without a cluster": func() error {
			_, err := unnamed.Lookup(t.Context(), key, "P", 1, g.Fence)
			return err
		},
		"ledger on a store without a cluster": func() error {
			_, err := unnamed.Ledger(t.Context(), key)
			return err
		},
		"segment without a namespace": func() error {
			_, err := e.apply(noNamespace)
			return err
		},
		"segment without a resource": func() error {
			_, err := e.apply(noResource)
			return err
		},
		"lookup without a namespace": func() error {
			_, err := e.store.Lookup(t.Context(), postgres.Key{Resource: resource}, "P", 1, g.Fence)
			return err
		},
	} {
		err := try()
		if !errors.Is(err, fencing.ErrNoResource) || !strings.Contains(err.Error(), "NO_RESOURCE: ") {
			t.Errorf("%s: %v; want NO_RESOURCE", name, err)
		}
	}
	var n int
	if err := e.db.QueryRowContext(t.Context(), `SELECT (SELECT count(*) FROM lockwarden_fences) + (SELECT count(*) FROM effects)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written, %v; want none", n, err)
	}
	e.mustApply(segment(g, "P", 1, "p1"))
}

// A database created and filled by schema version 1 (records keyed by
// resource ID alone). Migrating it without a declared scope changes
// nothing and the store cannot use it; with AdoptLegacyRecords every record
// moves to that scope and the history keeps working there: resends are
// answered with their receipts, stale fences refused, the triggers hold.
func TestMigrateFromSchemaVersion1(t *testing.T) {
	db, err := postgres.Open(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	all, err := postgres.Migrations()
	if err != nil || len(all) < 2 || all[0].Version != 1 || all[1].Version != 2 {
		t.Fatalf("Migrations() = %v, %v; want versions 1 and 2", all, err)
	}
	// Schema version 1, as Migrate applied it before version 2 shipped.
	for _, stmt := range []string{
		`CREATE TABLE lockwarden_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		all[0].SQL,
		`INSERT INTO lockwarden_schema_migrations (version, name) VALUES (1, '` + all[0].Name + `')`,
	} {
		if _, err := db.ExecContext(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	createEffects(t, db)

	// Its records: grant a wrote segment 1 of "op" under fence 1, grant b
	// took the operation over with fence 2 and wrote segment 2; a
	// conflicting resend was quarantined and a regression alarmed.
	reg := newRegistry()
	a := reg.acquire(key, "a", 60)
	b := reg.acquire(key, "b", 60)
	var r1, r2 string
	for _, q := range []struct {
		stmt string
		args []any
		into *string
	}{
		{stmt: `INSERT INTO lockwarden_fences (resource, fence, grant_uid, root, last_seq) VALUES ($1, 2, $2, 'op', 2)`, args: []any{resource, b.UID}},
		{stmt: `INSERT INTO lockwarden_receipts (resource, root, seq, fence, grant_uid, digest, accepted_at) VALUES ($1, 'op', 1, 1, $2, $3, $4) RETURNING receipt_id::text`,
			args: []any{resource, a.UID, fencing.PayloadDigest([]byte("p1")), t0}, into: &r1},
		{stmt: `INSERT INTO lockwarden_receipts (resource, root, seq, fence, grant_uid, digest, accepted_at) VALUES ($1, 'op', 2, 2, $2, $3, $4) RETURNING receipt_id::text`,
			args: []any{resource, b.UID, fencing.PayloadDigest([]byte("p2")), t0}, into: &r2},
	} {
		var err error
		if q.into != nil {
			err = db.QueryRowContext(t.Context(), q.stmt, q.args...).Scan(q.into)
		} else {
			_, err = db.ExecContext(t.Context(), q.stmt, q.args...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(t.Context(), `INSERT INTO lockwarden_quarantine (resource, root, seq, digest, payload, fence, grant_uid, caller, conflicts_with, first_received_at, last_received_at)
		VALUES ($1, 'op', 2, 'sha256:other', 'p2, amended', 2, $2, 'b', $3::uuid, $4, $4)`, resource, b.UID, r2, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `INSERT INTO lockwarden_fence_alarms (resource, fence, grant_uid, root, caller, highest_fence, highest_grant_uid, highest_root, detail, first_raised_at, last_raised_at)
		VALUES ($1, 1, 'uid-old', 'op-old', 'x', 2, $2, 'op', 'reissued', $3, $3)`, resource, b.UID, t0); err != nil {
		t.Fatal(err)
	}
	tableRows := func() string {
		var f, r, q, al int
		if err := db.QueryRowContext(t.Context(), `SELECT (SELECT count(*) FROM lockwarden_fences), (SELECT count(*) FROM lockwarden_receipts),
			(SELECT count(*) FROM lockwarden_quarantine), (SELECT count(*) FROM lockwarden_fence_alarms)`).Scan(&f, &r, &q, &al); err != nil {
			t.Fatal(err)
		}
		return strings.Join([]string{strconv.Itoa(f), strconv.Itoa(r), strconv.Itoa(q), strconv.Itoa(al)}, " ")
	}
	version := func() int {
		var v int
		if err := db.QueryRowContext(t.Context(), `SELECT max(version) FROM lockwarden_schema_migrations`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	// Without a declared scope: refused, nothing changed, and the store
	// refuses to write to the old schema.
	err = postgres.Migrate(t.Context(), db)
	if !errors.Is(err, fencing.ErrNoResource) || !strings.Contains(err.Error(), "NO_RESOURCE: the lockwarden tables hold fence records from before schema version 2") {
		t.Fatalf("Migrate() without a legacy scope = %v; want NO_RESOURCE", err)
	}
	if v, rows := version(), tableRows(); v != 1 || rows != "1 2 1 1" {
		t.Fatalf("after the refused migration: version %d, rows %s; want version 1 and every row kept", v, rows)
	}
	store := postgres.New(db, reg, postgres.WithCluster(cluster), postgres.WithClock(reg.clk))
	if res, err := store.Apply(t.Context(), segment(b, "op", 3, "p3"), effect(segment(b, "op", 3, "p3"))); err == nil || res.Applied {
		t.Fatalf("Apply() on schema version 1 = %+v, %v; want an error", res, err)
	}

	// With it: every record moves to the declared scope.
	scope := postgres.Scope{Cluster: cluster, Namespace: namespace}
	if err := postgres.Migrate(t.Context(), db, postgres.AdoptLegacyRecords(scope)); err != nil {
		t.Fatalf("Migrate() with a legacy scope: %v", err)
	}
	if v, rows := version(), tableRows(); v != 2 || rows != "1 2 1 1" {
		t.Fatalf("after the migration: version %d, rows %s; want version 2 and every row kept", v, rows)
	}
	var unscoped int
	if err := db.QueryRowContext(t.Context(), `SELECT
		(SELECT count(*) FROM lockwarden_fences WHERE (cluster, namespace) <> ($1, $2)) +
		(SELECT count(*) FROM lockwarden_receipts WHERE (cluster, namespace) <> ($1, $2)) +
		(SELECT count(*) FROM lockwarden_quarantine WHERE (cluster, namespace) <> ($1, $2)) +
		(SELECT count(*) FROM lockwarden_fence_alarms WHERE (cluster, namespace) <> ($1, $2))`, cluster, namespace).Scan(&unscoped); err != nil || unscoped != 0 {
		t.Fatalf("%d records outside the declared scope, %v; want none", unscoped, err)
	}
	if l, err := store.Ledger(t.Context(), key); err != nil || l != (fencing.Ledger{Fence: 2, GrantUID: b.UID, Root: "op", LastSeq: 2}) {
		t.Fatalf("migrated ledger = %+v, %v", l, err)
	}
	if q, err := store.Quarantine(t.Context(), key); err != nil || len(q) != 1 || q[0].Scope != scope || q[0].ConflictsWith != r2 {
		t.Fatalf("migrated quarantine = %+v, %v", q, err)
	}
	if al, err := store.Alarms(t.Context(), key); err != nil || len(al) != 1 || al[0].Scope != scope || al[0].GrantUID != "uid-old" {
		t.Fatalf("migrated alarms = %+v, %v", al, err)
	}

	// The history works in its scope.
	res, err := store.Apply(t.Context(), segment(b, "op", 2, "p2"), effect(segment(b, "op", 2, "p2")))
	if err != nil || res.Applied || res.Receipt.ID != r2 {
		t.Fatalf("resend of migrated segment 2 = %+v, %v; want receipt %s", res, err, r2)
	}
	if _, err := store.Apply(t.Context(), segment(a, "op", 3, "p3 (a)"), nil); fencing.ReasonOf(err) != fencing.ReasonStaleOwner {
		t.Fatalf("a's fence 1 after the migration: %v; want STALE_OWNER", err)
	}
	if res, err := store.Apply(t.Context(), segment(b, "op", 3, "p3"), effect(segment(b, "op", 3, "p3"))); err != nil || !res.Applied {
		t.Fatalf("segment 3 under fence 2 = %+v, %v; want applied", res, err)
	}
	receipts, err := store.Receipts(t.Context(), key, "op")
	if err != nil || len(receipts) != 3 || receipts[0].ID != r1 || receipts[1].ID != r2 {
		t.Fatalf("receipts of op = %+v, %v; want the two migrated ones and segment 3", receipts, err)
	}
	// Another namespace starts its own ledger for the same resource ID.
	other := postgres.Key{Namespace: "default", Resource: resource}
	o1 := reg.acquire(other, "o", 60)
	if res, err := store.Apply(t.Context(), segment(o1, "op", 1, "p1"), effect(segment(o1, "op", 1, "p1"))); err != nil || !res.Applied {
		t.Fatalf("fence 1 in namespace default = %+v, %v; want applied", res, err)
	}

	// The migrated records are as protected as new ones.
	for _, stmt := range []string{
		`UPDATE lockwarden_fences SET fence = 1 WHERE namespace = 'billing'`,
		`UPDATE lockwarden_fences SET namespace = 'moved' WHERE namespace = 'billing'`,
		`UPDATE lockwarden_fences SET cluster = 'moved' WHERE namespace = 'billing'`,
		`DELETE FROM lockwarden_fences WHERE namespace = 'billing'`,
		`UPDATE lockwarden_receipts SET namespace = 'moved'`,
		`INSERT INTO lockwarden_fences (resource) VALUES ('unscoped')`,
	} {
		if _, err := db.ExecContext(t.Context(), stmt); err == nil {
			t.Fatalf("%s succeeded; want it refused", stmt)
		}
	}
	if err := postgres.Migrate(t.Context(), db); err != nil {
		t.Fatalf("migrating a current schema: %v", err)
	}
}
