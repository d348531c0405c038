package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// invoice is one invoice of the batch.
type invoice struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amountCents"`
}

// batch is the settlement operation: its invoices cut into segments.
type batch struct {
	name     string
	resource string
	// root is the operation root: "sha256:" and the hex digest of the
	// whole batch, the same for every run over the same batch.
	root     string
	segments [][]invoice
}

// newBatch builds the batch NAME of n invoices. A real worker reads its
// invoices from the database; here they are generated, the same for every
// run with the same name.
func newBatch(name string, n, segmentSize int) (batch, error) {
	resource := "invoice-batch/" + name
	if !lockingv1alpha1.ValidResourceID(resource) {
		return batch{}, fmt.Errorf("batch %q does not make a valid resource ID", name)
	}
	if n < 1 || segmentSize < 1 {
		return batch{}, errors.New("--invoices and --segment-size must be at least 1")
	}
	all := make([]invoice, n)
	for i := range all {
		id := fmt.Sprintf("INV-%s-%04d", name, i+1)
		sum := sha256.Sum256([]byte(id))
		all[i] = invoice{ID: id, AmountCents: 100 + int64(binary.BigEndian.Uint32(sum[:4])%100000)}
	}
	whole, _ := json.Marshal(struct {
		Batch    string    `json:"batch"`
		Invoices []invoice `json:"invoices"`
	}{name, all})
	b := batch{name: name, resource: resource, root: fencing.PayloadDigest(whole)}
	for len(all) > 0 {
		k := min(segmentSize, len(all))
		b.segments = append(b.segments, all[:k])
		all = all[k:]
	}
	return b, nil
}

// holder is what the worker presents with each segment: its grant, and
// the namespace the grant (and so its fence) belongs to.
type holder struct {
	namespace string
	owner     string
	uid       string
	fence     int64
}

func holderOf(g *lockingv1alpha1.LockGrant) holder {
	return holder{namespace: g.Namespace, owner: g.Spec.Owner, uid: string(g.UID), fence: g.Status.FenceToken}
}

// migrateLockKey serializes the worker's own schema change across workers
// starting at once.
const migrateLockKey = 0x736574746c65 // "settle"

// migrate applies the store's schema and the worker's own table. The
// invoices of each namespace are its own: a batch settled in namespace
// default and the same batch settled in namespace billing are two
// settlements. adopt declares that the records and invoices written before
// namespaces were part of their keys belong to scope (--adopt-legacy-records);
// without it such a database is refused, unchanged.
func migrate(ctx context.Context, db *sql.DB, scope postgres.Scope, adopt bool) error {
	var opts []postgres.MigrateOption
	if adopt {
		opts = append(opts, postgres.AdoptLegacyRecords(scope))
	}
	if err := postgres.Migrate(ctx, db, opts...); err != nil {
		if errors.Is(err, fencing.ErrNoResource) {
			return fmt.Errorf("%w; if every earlier run on this database used cluster %q and namespace %q, run again with --adopt-legacy-records", err, scope.Cluster, scope.Namespace)
		}
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLockKey)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS settlement_invoices (
		namespace      text NOT NULL,
		invoice_id     text NOT NULL,
		batch          text NOT NULL,
		amount_cents   bigint NOT NULL,
		fence          bigint NOT NULL,
		operation_root text NOT NULL,
		segment        bigint NOT NULL,
		settled_at     timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (namespace, invoice_id)
	)`); err != nil {
		return err
	}
	var scoped bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'settlement_invoices' AND column_name = 'namespace')`).Scan(&scoped); err != nil {
		return err
	}
	if !scoped {
		// A table of an earlier version of this worker, keyed by invoice
		// ID alone.
		if !adopt {
			return &fencing.Error{Reason: fencing.ReasonNoResource, Detail: fmt.Sprintf(
				"settlement_invoices holds invoices from before namespaces were part of their key; if every earlier run on this database used namespace %q, run again with --adopt-legacy-records", scope.Namespace)}
		}
		for _, stmt := range []string{
			`ALTER TABLE settlement_invoices ADD COLUMN namespace text`,
			`UPDATE settlement_invoices SET namespace = $1`,
			`ALTER TABLE settlement_invoices ALTER COLUMN namespace SET NOT NULL`,
			`ALTER TABLE settlement_invoices DROP CONSTRAINT settlement_invoices_pkey`,
			`ALTER TABLE settlement_invoices ADD PRIMARY KEY (namespace, invoice_id)`,
		} {
			var args []any
			if strings.Contains(stmt, "$1") {
				args = append(args, scope.Namespace)
			}
			if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
				return fmt.Errorf("adding namespaces to settlement_invoices: %w", err)
			}
		}
	}
	return tx.Commit()
}

// segment returns segment seq (from 1) of the batch as the store takes it.
func (b batch) segment(h holder, seq int) postgres.Segment {
	payload, _ := json.Marshal(b.segments[seq-1])
	return postgres.Segment{Namespace: h.namespace, Resource: b.resource, Caller: h.owner, Fence: h.fence, GrantUID: h.uid,
		Root: b.root, Seq: int64(seq), Payload: payload}
}

// settleInvoices is segment seq's effect: it settles its invoices in the
// segment's namespace.
func (b batch) settleInvoices(seg postgres.Segment) postgres.Mutation {
	return func(ctx context.Context, tx *sql.Tx) error {
		for _, inv := range b.segments[seg.Seq-1] {
			if _, err := tx.ExecContext(ctx, `INSERT INTO settlement_invoices (namespace, invoice_id, batch, amount_cents, fence, operation_root, segment)
				VALUES ($1, $2, $3, $4, $5, $6, $7)`, seg.Namespace, inv.ID, b.name, inv.AmountCents, seg.Fence, seg.Root, seg.Seq); err != nil {
				return fmt.Errorf("settling %s: %w", inv.ID, err)
			}
		}
		return nil
	}
}

// settle writes every segment of the batch under h, in order, and reports
// each outcome on out. It stops at the first refusal.
func settle(ctx context.Context, store *postgres.Store, h holder, b batch, out io.Writer) error {
	n := len(b.segments)
	for seq := 1; seq <= n; seq++ {
		seg := b.segment(h, seq)
		res, err := store.Apply(ctx, seg, b.settleInvoices(seg))
		if errors.Is(err, fencing.ErrMutationUnknown) {
			res, err = resolve(ctx, store, seg, b, out)
		}
		if err != nil {
			if r := fencing.ReasonOf(err); r != "" {
				fmt.Fprintf(out, "segment %d/%d refused %s; stopping\n", seq, n, r)
			}
			return fmt.Errorf("segment %d of %d: %w", seq, n, err)
		}
		what := "settled"
		if !res.Applied {
			what = fmt.Sprintf("already settled under fence %d", res.Receipt.Fence)
		}
		fmt.Fprintf(out, "segment %d/%d %s: %d invoices, receipt %s\n", seq, n, what, len(b.segments[seq-1]), res.Receipt.ID)
	}
	fmt.Fprintf(out, "batch %s settled: %d segments, operation %s\n", b.name, n, b.root)
	return nil
}

// resolve handles a commit whose answer was lost: look the segment up;
// when it is not found, resend it once (same payload, so a late copy of
// the first attempt and the resend cannot both take effect).
func resolve(ctx context.Context, store *postgres.Store, seg postgres.Segment, b batch, out io.Writer) (postgres.Result, error) {
	l, err := store.Lookup(ctx, seg.Key(), seg.Root, seg.Seq, seg.Fence)
	fmt.Fprintf(out, "segment %d: outcome unknown; lookup: %v\n", seg.Seq, l.State)
	switch {
	case err != nil:
		return postgres.Result{}, err
	case l.State == fencing.MutationApplied:
		return postgres.Result{Receipt: *l.Receipt}, nil
	}
	return store.Apply(ctx, seg, b.settleInvoices(seg))
}
