package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/internal/test/pgtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	resource  = "invoice-batch/2026-07-19"
	namespace = "billing"
	// cluster names the registry of newEnv's store.
	cluster = "test-cluster"
)

// key is the resource most tests write: resource in namespace.
var key = postgres.Key{Namespace: namespace, Resource: resource}

var t0 = time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)

// registry is an in-memory lock registry of one cluster with the
// controller's rules that matter here: one holder per resource of a
// namespace, fences issued in increasing order per namespace and resource
// (within an issuer epoch), and a snapshot/restore that puts the counter
// back, as restoring etcd from an old snapshot does.
type registry struct {
	clk *clocktesting.FakeClock

	mu       sync.Mutex
	epoch    int64
	counters map[postgres.Key]fencing.Counter
	grants   map[string]grant
	n        int
}

// grant is a grant of the registry and the namespace it lives in.
type grant struct {
	fencing.Grant
	Namespace string
}

func newRegistry() *registry {
	return &registry{clk: clocktesting.NewFakeClock(t0), counters: map[postgres.Key]fencing.Counter{}, grants: map[string]grant{}}
}

// at moves the clock to t=s seconds.
func (r *registry) at(s float64) { r.clk.SetTime(t0.Add(time.Duration(s * float64(time.Second)))) }

// acquire grants k's resource in k's namespace to owner for ttl seconds
// with the next fence of that namespace's counter. The resource must be
// free, except that a Held grant is released first.
func (r *registry) acquire(k postgres.Key, owner string, ttl float64) grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.counters[k]
	if h, ok := r.grants[c.HolderUID]; ok {
		h.State = fencing.StateReleased
		r.grants[h.UID] = h
	}
	r.n++
	next, err := fencing.NextFence(c.Fence, r.epoch)
	if err != nil {
		panic(err) // the test registry never raises its counters by hand
	}
	c.Fence = next
	g := grant{Namespace: k.Namespace, Grant: fencing.Grant{UID: fmt.Sprintf("uid-%s-%d", owner, r.n), Resource: k.Resource, Owner: owner,
		State: fencing.StateHeld, Fence: c.Fence, ExpiresAt: r.clk.Now().Add(time.Duration(ttl * float64(time.Second)))}}
	c.HolderUID = g.UID
	r.counters[k], r.grants[g.UID] = c, g
	return g
}

// end moves grant uid to a final state and frees its resource.
func (r *registry) end(uid string, s fencing.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.grants[uid]
	g.State = s
	r.grants[uid] = g
	k := postgres.Key{Namespace: g.Namespace, Resource: g.Resource}
	if c := r.counters[k]; c.HolderUID == uid {
		c.HolderUID = ""
		r.counters[k] = c
	}
}

// snapshot and restore model an etcd snapshot of the registry.
func (r *registry) snapshot() (map[postgres.Key]fencing.Counter, map[string]grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, gs := map[postgres.Key]fencing.Counter{}, map[string]grant{}
	for k, v := range r.counters {
		cs[k] = v
	}
	for k, v := range r.grants {
		gs[k] = v
	}
	return cs, gs
}

func (r *registry) restore(cs map[postgres.Key]fencing.Counter, gs map[string]grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counters, r.grants = cs, gs
}

func (r *registry) bumpEpoch() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch++
}

// GrantFacts answers as a Kubernetes registry does: the grant only when
// it lives in k's namespace, and the counter of k's namespace.
func (r *registry) GrantFacts(_ context.Context, k postgres.Key, uid string) (*fencing.Grant, *fencing.Counter, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var g *fencing.Grant
	if v, ok := r.grants[uid]; ok && v.Namespace == k.Namespace {
		g = &v.Grant
	}
	var c *fencing.Counter
	if v, ok := r.counters[k]; ok {
		c = &v
	}
	return g, c, nil
}

// env is one test's database, registry and store.
type env struct {
	t     *testing.T
	dsn   string
	db    *sql.DB
	reg   *registry
	store *postgres.Store
}

func newEnv(t *testing.T, opts ...postgres.Option) *env {
	t.Helper()
	dsn := pgtest.Database(t)
	db, err := postgres.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := postgres.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	createEffects(t, db)
	reg := newRegistry()
	return &env{t: t, dsn: dsn, db: db, reg: reg, store: postgres.New(db, reg, append([]postgres.Option{postgres.WithCluster(cluster), postgres.WithClock(reg.clk)}, opts...)...)}
}

// createEffects creates the caller's own data: one row per applied segment.
func createEffects(t *testing.T, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE effects (namespace text, resource text, root text, seq bigint, fence bigint, payload bytea)`); err != nil {
		t.Fatal(err)
	}
}

// segment is grant g's segment seq of operation root with payload p.
func segment(g grant, root string, seq int64, p string) postgres.Segment {
	return postgres.Segment{Namespace: g.Namespace, Resource: g.Resource, Caller: g.Owner, Fence: g.Fence, GrantUID: g.UID, Root: root, Seq: seq, Payload: []byte(p)}
}

// effect is the caller's mutation for seg: it records the segment in the
// effects table.
func effect(seg postgres.Segment) postgres.Mutation {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1, $2, $3, $4, $5, $6)`, seg.Namespace, seg.Resource, seg.Root, seg.Seq, seg.Fence, seg.Payload)
		return err
	}
}

func (e *env) apply(seg postgres.Segment) (postgres.Result, error) {
	return e.store.Apply(e.t.Context(), seg, effect(seg))
}

// mustApply applies seg and wants it applied for the first time.
func (e *env) mustApply(seg postgres.Segment) fencing.Receipt {
	e.t.Helper()
	res, err := e.apply(seg)
	if err != nil || !res.Applied {
		e.t.Fatalf("segment %d of %s under fence %d: %+v, %v; want applied", seg.Seq, seg.Root, seg.Fence, res, err)
	}
	return res.Receipt
}

// wantRefused applies seg and wants reason.
func (e *env) wantRefused(seg postgres.Segment, reason fencing.Reason) *postgres.Refusal {
	e.t.Helper()
	res, err := e.apply(seg)
	var r *postgres.Refusal
	if !errors.As(err, &r) || fencing.ReasonOf(err) != reason {
		e.t.Fatalf("segment %d of %s under fence %d: %+v, %v; want %s", seg.Seq, seg.Root, seg.Fence, res, err, reason)
	}
	return r
}

// effects returns what the caller's data holds for k: payload by
// "root/seq", and how many times each segment took effect.
func (e *env) effects(k postgres.Key) (map[string]string, map[string]int) {
	e.t.Helper()
	rows, err := e.db.QueryContext(e.t.Context(), `SELECT root, seq, payload FROM effects WHERE namespace = $1 AND resource = $2`, k.Namespace, k.Resource)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	payloads, counts := map[string]string{}, map[string]int{}
	for rows.Next() {
		var root string
		var seq int64
		var p []byte
		if err := rows.Scan(&root, &seq, &p); err != nil {
			e.t.Fatal(err)
		}
		k := fmt.Sprintf("%s/%d", root, seq)
		payloads[k] = string(p)
		counts[k]++
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return payloads, counts
}

func (e *env) ledger(k postgres.Key) fencing.Ledger {
	e.t.Helper()
	l, err := e.store.Ledger(e.t.Context(), k)
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}
