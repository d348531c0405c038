package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// DriverName is the database/sql driver the store is tested with: pgx v5.
const DriverName = "pgx"

// DB is what the store needs of a database: *sql.DB, or a *sql.Conn.
type DB interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Open opens a database/sql handle on dsn with the pgx driver, e.g.
// "postgres://user@host:5432/db?sslmode=verify-full". It does not connect.
func Open(dsn string) (*sql.DB, error) { return sql.Open(DriverName, dsn) }

// Registry reads the lock registry's facts about one grant, in the cluster
// the store is configured with (WithCluster). Reads must be linearizable
// (on Kubernetes: a direct GET from the API server, never an informer
// cache), since CheckSegment judges liveness on them.
type Registry interface {
	// GrantFacts returns the grant with UID grantUID in namespace
	// key.Namespace and the fence record of key.Resource in that namespace
	// (on Kubernetes: the LockGrant and the FenceCounter of
	// key.Namespace). A grant of another namespace counts as not existing,
	// so that a segment can only use a grant of its own scope. A grant or
	// record that does not exist is nil with a nil error; an error means
	// the registry could not answer, and the segment is not applied.
	GrantFacts(ctx context.Context, key Key, grantUID string) (*fencing.Grant, *fencing.Counter, error)
}

// RegistryFunc adapts a function to Registry.
type RegistryFunc func(ctx context.Context, key Key, grantUID string) (*fencing.Grant, *fencing.Counter, error)

// GrantFacts calls f.
func (f RegistryFunc) GrantFacts(ctx context.Context, key Key, grantUID string) (*fencing.Grant, *fencing.Counter, error) {
	return f(ctx, key, grantUID)
}

// Store applies fenced segments to a PostgreSQL database. It is safe for
// concurrent use; it holds no state of its own besides its configuration.
type Store struct {
	db           DB
	registry     Registry
	cluster      string
	clock        clock.PassiveClock
	metrics      *Metrics
	onRegression func(context.Context, *Refusal)
}

// Option configures a Store.
type Option func(*Store)

// WithCluster names the cluster whose registry issues the fences this store
// checks: one name per lockwarden installation, the same in every worker of
// it, and different for installations that issue fences independently.
// Every record the store writes or reads is keyed by this name, the
// segment's namespace and its resource ID. Required: a store without it
// refuses every segment and lookup with NO_RESOURCE.
//
// Choose a name you keep for as long as the database holds records, such as
// the cluster's name in your fleet ("prod-eu1"). A changed name starts
// empty ledgers: segments already accepted under the old name would no
// longer be recognized as resends, and a reissued fence would no longer
// raise FENCE_REGRESSION. Two installations sharing a name share ledgers
// and refuse each other's writes (fail closed). Object UIDs, such as the
// FenceIssuer's, are stable only as long as the object is never recreated
// (a restore by re-creating objects gives new UIDs), so a configured name is
// the safer choice.
func WithCluster(name string) Option { return func(s *Store) { s.cluster = name } }

// WithClock sets the clock that judges leases and stamps receipts. Default:
// the real clock.
func WithClock(c clock.PassiveClock) Option { return func(s *Store) { s.clock = c } }

// WithMetrics counts every decision on m. Default: no metrics.
func WithMetrics(m *Metrics) Option { return func(s *Store) { s.metrics = m } }

// WithRegressionHook calls f after a FENCE_REGRESSION refusal has been
// recorded, with the refusal, so that the caller raises its alarm (a
// condition, an Event, a page). f runs on Apply's goroutine before Apply
// returns; it must not block for long. Default: none.
func WithRegressionHook(f func(ctx context.Context, r *Refusal)) Option {
	return func(s *Store) { s.onRegression = f }
}

// New returns a store on db that reads grants from registry. The schema
// must be in place (see Migrate).
func New(db DB, registry Registry, opts ...Option) *Store {
	s := &Store{db: db, registry: registry, clock: clock.RealClock{}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Segment is one segment as a writer hands it to Apply.
type Segment struct {
	// Namespace is the namespace the resource ID is scoped to: the
	// namespace of the writer's LockGrant (lock.Segment's Grant.Namespace).
	// Required.
	Namespace string
	// Resource is the protected resource's ID, e.g. "invoice-batch/2026-07-19".
	Resource string
	// Caller is the identity of the writer; it must be the grant's owner.
	Caller string
	// Fence and GrantUID are the writer's grant's fence and UID.
	Fence    int64
	GrantUID string
	// Root is the operation root, shared by all segments of the operation
	// and by every retry of it.
	Root string
	// Seq is the segment's position in the operation, from 1.
	Seq int64
	// Payload is the segment's canonical content. Its digest
	// (fencing.PayloadDigest) tells a resend from a conflict; on a conflict
	// it is kept in quarantine.
	Payload []byte
}

// Key returns the segment's resource: its namespace and resource ID.
func (s Segment) Key() Key { return Key{Namespace: s.Namespace, Resource: s.Resource} }

func (s Segment) fencing() fencing.Segment {
	return fencing.Segment{Fence: s.Fence, GrantUID: s.GrantUID, Root: s.Root, Seq: s.Seq, Digest: fencing.PayloadDigest(s.Payload)}
}

// Mutation is the caller's change for one segment. It runs inside Apply's
// transaction, only when the segment is accepted, at most once per Apply
// call. It must not commit or roll back tx. An error aborts the whole
// transaction: nothing of the segment is recorded.
type Mutation func(ctx context.Context, tx *sql.Tx) error

// Result is an accepted segment.
type Result struct {
	// Receipt is the segment's receipt: new when Applied, else the one
	// written when the segment was first accepted.
	Receipt fencing.Receipt
	// Applied reports that this call ran the mutation; false for a resend
	// of a segment already accepted, which had no effect.
	Applied bool
}

// Apply decides on seg and, when it is accepted, runs mutate and records
// the receipt and the resource's new ledger, all in one transaction. It
// returns:
//   - Result{Applied: true} and a new receipt: mutate ran and committed;
//   - Result{Applied: false} and the original receipt: a resend; mutate
//     did not run (the ledger may have moved to seg's larger fence);
//   - a *Refusal (errors.Is with the reason's sentinel): nothing applied.
//     SEGMENT_CONFLICT payloads are quarantined and FENCE_REGRESSION is
//     recorded, counted and handed to the regression hook. A segment
//     without a namespace or resource, or a store without WithCluster, is
//     refused NO_RESOURCE before the database is touched;
//   - an error matching fencing.ErrMutationUnknown: the commit was sent
//     but its answer was lost; call Lookup before anything else;
//   - any other error (database, registry, mutate's own): nothing applied.
func (s *Store) Apply(ctx context.Context, seg Segment, mutate Mutation) (Result, error) {
	fs := seg.fencing()
	at, bad := s.ref(seg.Key())
	if bad != nil {
		return Result{}, &Refusal{Err: bad, Scope: at.Scope, Resource: seg.Resource, Caller: seg.Caller, Segment: fs}
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return Result{}, fmt.Errorf("postgres: beginning a transaction: %w", err)
	}
	defer func() { _ = tx.Rollback() }()

	w, err := s.gather(ctx, tx, at, seg, fs)
	if err != nil {
		return Result{}, err
	}
	d, err := fencing.CheckSegment(w)
	if err != nil {
		return Result{}, s.refuse(ctx, tx, at, seg, w, err)
	}

	switch d.Verdict {
	case fencing.VerdictApply:
		if mutate != nil {
			if err := mutate(ctx, tx); err != nil {
				return Result{}, fmt.Errorf("postgres: segment %d of %s on %s: mutation: %w", seg.Seq, seg.Root, at, err)
			}
		}
		r := fencing.Receipt{Resource: seg.Resource, Fence: fs.Fence, GrantUID: fs.GrantUID, Root: fs.Root, Seq: fs.Seq, Digest: fs.Digest, AcceptedAt: w.Now}
		if err := tx.QueryRowContext(ctx, `INSERT INTO lockwarden_receipts (cluster, namespace, resource, root, seq, fence, grant_uid, digest, accepted_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING receipt_id::text`,
			at.args(r.Root, r.Seq, r.Fence, r.GrantUID, r.Digest, r.AcceptedAt)...).Scan(&r.ID); err != nil {
			return Result{}, fmt.Errorf("postgres: writing the receipt: %w", err)
		}
		if err := s.storeLedger(ctx, tx, at, d.Next, w.Now); err != nil {
			return Result{}, err
		}
		if err := commit(ctx, tx, seg); err != nil {
			return Result{}, err
		}
		s.metrics.observe("applied")
		return Result{Receipt: r, Applied: true}, nil
	case fencing.VerdictDuplicate:
		if d.Next != w.Ledger {
			if err := s.storeLedger(ctx, tx, at, d.Next, w.Now); err != nil {
				return Result{}, err
			}
		}
		if err := commit(ctx, tx, seg); err != nil {
			return Result{}, err
		}
		s.metrics.observe("duplicate")
		return Result{Receipt: *d.Receipt}, nil
	}
	return Result{}, fmt.Errorf("postgres: unknown verdict %v", d.Verdict)
}

// gather locks the resource's fence row and reads every fact CheckSegment
// needs. The registry is read after the lock is granted, so that its
// answer is no older than every write to the resource before this one.
func (s *Store) gather(ctx context.Context, tx *sql.Tx, at ref, seg Segment, fs fencing.Segment) (fencing.SegmentWrite, error) {
	w := fencing.SegmentWrite{Resource: seg.Resource, Caller: seg.Caller, Segment: fs}
	if _, err := tx.ExecContext(ctx, `INSERT INTO lockwarden_fences (cluster, namespace, resource) VALUES ($1, $2, $3)
		ON CONFLICT (cluster, namespace, resource) DO NOTHING`, at.args()...); err != nil {
		return w, fmt.Errorf("postgres: creating the fence record of %s: %w", at, err)
	}
	l, err := readLedger(ctx, tx, at, "FOR UPDATE")
	if err != nil {
		return w, err
	}
	w.Ledger = l
	if w.Prior, err = readReceipt(ctx, tx, at, seg.Root, seg.Seq); err != nil {
		return w, err
	}
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM lockwarden_receipts
		WHERE cluster = $1 AND namespace = $2 AND resource = $3 AND root = $4`,
		at.args(seg.Root)...).Scan(&w.RootLastSeq); err != nil {
		return w, fmt.Errorf("postgres: reading operation %s: %w", seg.Root, err)
	}
	if w.Grant, w.Counter, err = s.registry.GrantFacts(ctx, seg.Key(), seg.GrantUID); err != nil {
		return w, fmt.Errorf("postgres: reading grant %s from the registry: %w", seg.GrantUID, err)
	}
	w.Now = s.now()
	return w, nil
}

// refuse records what a refusal must leave behind (a quarantined payload, a
// regression alarm), counts it, and returns the *Refusal.
func (s *Store) refuse(ctx context.Context, tx *sql.Tx, at ref, seg Segment, w fencing.SegmentWrite, err error) error {
	var fe *fencing.Error
	if !errors.As(err, &fe) {
		return err
	}
	r := &Refusal{Err: fe, Scope: at.Scope, Resource: seg.Resource, Caller: seg.Caller, Segment: w.Segment, Ledger: w.Ledger}
	s.metrics.observe(string(fe.Reason))
	var record error
	switch fe.Reason {
	case fencing.ReasonSegmentConflict:
		_, record = tx.ExecContext(ctx, `INSERT INTO lockwarden_quarantine
			(cluster, namespace, resource, root, seq, digest, payload, fence, grant_uid, caller, conflicts_with, first_received_at, last_received_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::uuid, $12, $12)
			ON CONFLICT (cluster, namespace, resource, root, seq, digest) DO UPDATE
			SET attempts = lockwarden_quarantine.attempts + 1, last_received_at = EXCLUDED.last_received_at`,
			at.args(seg.Root, seg.Seq, w.Segment.Digest, nonNil(seg.Payload), seg.Fence, seg.GrantUID, seg.Caller, w.Prior.ID, w.Now)...)
		if record == nil {
			record = tx.Commit()
		}
		r.Quarantined = record == nil
	case fencing.ReasonFenceRegression:
		_, record = tx.ExecContext(ctx, `INSERT INTO lockwarden_fence_alarms
			(cluster, namespace, resource, fence, grant_uid, root, caller, highest_fence, highest_grant_uid, highest_root, detail, first_raised_at, last_raised_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)
			ON CONFLICT (cluster, namespace, resource, grant_uid, fence) DO UPDATE
			SET attempts = lockwarden_fence_alarms.attempts + 1, last_raised_at = EXCLUDED.last_raised_at`,
			at.args(seg.Fence, seg.GrantUID, seg.Root, seg.Caller, w.Ledger.Fence, w.Ledger.GrantUID, w.Ledger.Root, fe.Detail, w.Now)...)
		if record == nil {
			record = tx.Commit()
		}
		s.metrics.regression(at)
		if s.onRegression != nil {
			s.onRegression(ctx, r)
		}
	}
	if record != nil {
		return errors.Join(r, fmt.Errorf("postgres: recording the refusal: %w", record))
	}
	return r
}

func (s *Store) storeLedger(ctx context.Context, tx *sql.Tx, at ref, l fencing.Ledger, now time.Time) error {
	if _, err := tx.ExecContext(ctx, `UPDATE lockwarden_fences SET fence = $4, grant_uid = $5, root = $6, last_seq = $7, updated_at = $8
		WHERE cluster = $1 AND namespace = $2 AND resource = $3`,
		at.args(l.Fence, l.GrantUID, l.Root, l.LastSeq, now)...); err != nil {
		return fmt.Errorf("postgres: recording fence %d on %s: %w", l.Fence, at, err)
	}
	return nil
}

// commit commits tx and tells a failed commit (nothing applied) from one
// whose outcome is unknown (the answer was lost).
func commit(ctx context.Context, tx *sql.Tx, seg Segment) error {
	if err := ctx.Err(); err != nil {
		// Not sent: the deferred rollback ends the transaction.
		return fmt.Errorf("postgres: segment %d of %s not committed: %w", seg.Seq, seg.Root, err)
	}
	err := tx.Commit()
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("postgres: segment %d of %s: commit failed: %w", seg.Seq, seg.Root, err)
	}
	return fmt.Errorf("%w: segment %d of %s on %s: the commit's answer was lost: %w", fencing.ErrMutationUnknown, seg.Seq, seg.Root, seg.Key(), err)
}

func (s *Store) now() time.Time {
	// PostgreSQL keeps microseconds: a receipt read back equals the one
	// returned.
	return s.clock.Now().UTC().Truncate(time.Microsecond)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// querier is what the read helpers need: a *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readLedger reads the fence row of the resource at with the given locking
// clause ("FOR UPDATE", "FOR SHARE" or ""); a resource without a row has
// the zero ledger.
func readLedger(ctx context.Context, q querier, at ref, lock string) (fencing.Ledger, error) {
	var l fencing.Ledger
	err := q.QueryRowContext(ctx, `SELECT fence, grant_uid, root, last_seq FROM lockwarden_fences
		WHERE cluster = $1 AND namespace = $2 AND resource = $3 `+lock, at.args()...).
		Scan(&l.Fence, &l.GrantUID, &l.Root, &l.LastSeq)
	if errors.Is(err, sql.ErrNoRows) {
		return fencing.Ledger{}, nil
	}
	if err != nil {
		return l, fmt.Errorf("postgres: reading the fence record of %s: %w", at, err)
	}
	return l, nil
}

// readReceipt returns the receipt of the resource at, root and seq, or nil.
func readReceipt(ctx context.Context, q querier, at ref, root string, seq int64) (*fencing.Receipt, error) {
	r := &fencing.Receipt{Resource: at.resource, Root: root, Seq: seq}
	err := q.QueryRowContext(ctx, `SELECT receipt_id::text, fence, grant_uid, digest, accepted_at FROM lockwarden_receipts
		WHERE cluster = $1 AND namespace = $2 AND resource = $3 AND root = $4 AND seq = $5`, at.args(root, seq)...).
		Scan(&r.ID, &r.Fence, &r.GrantUID, &r.Digest, &r.AcceptedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: reading the receipt of segment %d of %s: %w", seq, root, err)
	}
	r.AcceptedAt = r.AcceptedAt.UTC()
	return r, nil
}
