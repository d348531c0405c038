package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Lookup is what the resource proves about one attempted segment.
type Lookup struct {
	// State is Applied (Receipt is set), Absent (no receipt, and the
	// attempt's fence can no longer be accepted: a newer fence may redo
	// the segment) or Unknown (no receipt yet, but the attempt could still
	// land: do not redo it; write under a newer fence first, or report the
	// operation for reconciliation).
	State fencing.MutationState
	// Receipt is the segment's receipt when State is Applied.
	Receipt *fencing.Receipt
	// Ledger is the resource's record at the lookup.
	Ledger fencing.Ledger
}

// Lookup answers MUTATION_UNKNOWN: did segment seq of operation root reach
// the resource key (in the store's cluster), after an attempt under
// attemptFence whose outcome the caller does not know? It waits for any
// write to the resource in flight (it takes the fence row FOR SHARE), then
// reads the receipt and classifies it with fencing.ResolveMutation. When
// the database cannot answer, it returns State Unknown and an error
// matching fencing.ErrMutationUnknown. A key without namespace or resource,
// or a store without WithCluster, is refused NO_RESOURCE (State Unknown).
func (s *Store) Lookup(ctx context.Context, key Key, root string, seq, attemptFence int64) (Lookup, error) {
	at, bad := s.ref(key)
	if bad != nil {
		return Lookup{}, bad
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return Lookup{}, fmt.Errorf("%w: %w", fencing.ErrMutationUnknown, err)
	}
	defer func() { _ = tx.Rollback() }()
	l, err := readLedger(ctx, tx, at, "FOR SHARE")
	if err != nil {
		return Lookup{}, fmt.Errorf("%w: %w", fencing.ErrMutationUnknown, err)
	}
	r, err := readReceipt(ctx, tx, at, root, seq)
	if err != nil {
		return Lookup{Ledger: l}, fmt.Errorf("%w: %w", fencing.ErrMutationUnknown, err)
	}
	return Lookup{State: fencing.ResolveMutation(l, r, attemptFence), Receipt: r, Ledger: l}, nil
}

// Ledger returns the current record of the resource key in the store's
// cluster; the zero Ledger when it has accepted nothing.
func (s *Store) Ledger(ctx context.Context, key Key) (fencing.Ledger, error) {
	at, bad := s.ref(key)
	if bad != nil {
		return fencing.Ledger{}, bad
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fencing.Ledger{}, err
	}
	defer func() { _ = tx.Rollback() }()
	return readLedger(ctx, tx, at, "")
}

// Receipts returns the receipts of operation root on the resource key, by
// sequence: which segments of the operation took effect, for example to
// reconcile an operation its owner left half-done.
func (s *Store) Receipts(ctx context.Context, key Key, root string) ([]fencing.Receipt, error) {
	at, bad := s.ref(key)
	if bad != nil {
		return nil, bad
	}
	var out []fencing.Receipt
	err := s.query(ctx, func(tx *sql.Tx) (*sql.Rows, error) {
		return tx.QueryContext(ctx, `SELECT receipt_id::text, fence, grant_uid, seq, digest, accepted_at FROM lockwarden_receipts
			WHERE cluster = $1 AND namespace = $2 AND resource = $3 AND root = $4 ORDER BY seq`, at.args(root)...)
	}, func(rows *sql.Rows) error {
		r := fencing.Receipt{Resource: key.Resource, Root: root}
		if err := rows.Scan(&r.ID, &r.Fence, &r.GrantUID, &r.Seq, &r.Digest, &r.AcceptedAt); err != nil {
			return err
		}
		r.AcceptedAt = r.AcceptedAt.UTC()
		out = append(out, r)
		return nil
	})
	return out, err
}

// Quarantined is a payload refused as SEGMENT_CONFLICT, kept for
// inspection. It was never applied.
type Quarantined struct {
	// Scope and Resource name the resource that refused the payload.
	Scope    Scope
	Resource string
	Root     string
	Seq      int64
	Digest   string
	Payload  []byte
	Fence    int64
	GrantUID string
	Caller   string
	// ConflictsWith is the receipt ID of the payload that was accepted.
	ConflictsWith string
	// Attempts counts how often this payload was sent.
	Attempts                        int64
	FirstReceivedAt, LastReceivedAt time.Time
}

// Quarantine returns the quarantined payloads of the resource key, oldest
// first.
func (s *Store) Quarantine(ctx context.Context, key Key) ([]Quarantined, error) {
	at, bad := s.ref(key)
	if bad != nil {
		return nil, bad
	}
	var out []Quarantined
	err := s.query(ctx, func(tx *sql.Tx) (*sql.Rows, error) {
		return tx.QueryContext(ctx, `SELECT root, seq, digest, payload, fence, grant_uid, caller, conflicts_with::text,
			attempts, first_received_at, last_received_at FROM lockwarden_quarantine
			WHERE cluster = $1 AND namespace = $2 AND resource = $3 ORDER BY id`, at.args()...)
	}, func(rows *sql.Rows) error {
		q := Quarantined{Scope: at.Scope, Resource: key.Resource}
		if err := rows.Scan(&q.Root, &q.Seq, &q.Digest, &q.Payload, &q.Fence, &q.GrantUID, &q.Caller, &q.ConflictsWith,
			&q.Attempts, &q.FirstReceivedAt, &q.LastReceivedAt); err != nil {
			return err
		}
		q.FirstReceivedAt, q.LastReceivedAt = q.FirstReceivedAt.UTC(), q.LastReceivedAt.UTC()
		out = append(out, q)
		return nil
	})
	return out, err
}

// Alarm is a FENCE_REGRESSION the store refused: a grant presented a fence
// the resource had already seen from another grant or operation, or one
// below it while the registry named that grant as the holder.
type Alarm struct {
	// Scope and Resource name the resource that refused the fence.
	Scope    Scope
	Resource string
	Fence    int64
	GrantUID string
	Root     string
	Caller   string
	// Highest is the resource's record when the alarm was first raised.
	Highest fencing.Ledger
	Detail  string
	// Attempts counts the refused segments of this grant and fence.
	Attempts                    int64
	FirstRaisedAt, LastRaisedAt time.Time
}

// Alarms returns the fence regressions recorded for the resource key,
// oldest first.
func (s *Store) Alarms(ctx context.Context, key Key) ([]Alarm, error) {
	at, bad := s.ref(key)
	if bad != nil {
		return nil, bad
	}
	var out []Alarm
	err := s.query(ctx, func(tx *sql.Tx) (*sql.Rows, error) {
		return tx.QueryContext(ctx, `SELECT fence, grant_uid, root, caller, highest_fence, highest_grant_uid, highest_root, detail,
			attempts, first_raised_at, last_raised_at FROM lockwarden_fence_alarms
			WHERE cluster = $1 AND namespace = $2 AND resource = $3 ORDER BY id`, at.args()...)
	}, func(rows *sql.Rows) error {
		a := Alarm{Scope: at.Scope, Resource: key.Resource}
		if err := rows.Scan(&a.Fence, &a.GrantUID, &a.Root, &a.Caller, &a.Highest.Fence, &a.Highest.GrantUID, &a.Highest.Root, &a.Detail,
			&a.Attempts, &a.FirstRaisedAt, &a.LastRaisedAt); err != nil {
			return err
		}
		a.FirstRaisedAt, a.LastRaisedAt = a.FirstRaisedAt.UTC(), a.LastRaisedAt.UTC()
		out = append(out, a)
		return nil
	})
	return out, err
}

// query runs one read-only query and scans each row.
func (s *Store) query(ctx context.Context, q func(*sql.Tx) (*sql.Rows, error), scan func(*sql.Rows) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := q(tx)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return fmt.Errorf("postgres: %w", err)
		}
	}
	return rows.Err()
}
