package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// A worker that holds a grant writes one segment of its settlement batch:
// its own change and the fence bookkeeping commit together, or not at all.
func ExampleStore_Apply() {
	ctx := context.Background()
	db, _ := postgres.Open("postgres://settlement@db.billing:5432/billing?sslmode=verify-full")
	_ = postgres.Migrate(ctx, db)
	// The registry: on Kubernetes, direct GETs of the LockGrant and its
	// FenceCounter (see examples/settlement).
	var registry postgres.Registry
	// The cluster names the lockwarden installation that issues the fences.
	store := postgres.New(db, registry, postgres.WithCluster("prod-eu1"))

	seg := postgres.Segment{
		Namespace: "billing", // the LockGrant's namespace: fences are per namespace
		Resource:  "invoice-batch/2026-07-19",
		Caller:    "system:serviceaccount:billing:settlement-7",
		Fence:     8842, GrantUID: "6c1b2a4e-0f4b-4a53-9d0e-2f6f7a1e9c11",
		Root: "sha256:51c0e0b7a9f1d6c44a07d56f0b1b3e4fb1a9f3e0e2c6d7a8b9c0d1e2f3a4b5c6", Seq: 1,
		Payload: []byte(`["INV-0001","INV-0002"]`),
	}
	res, err := store.Apply(ctx, seg, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE invoices SET settled = true WHERE id = ANY($1)`, []string{"INV-0001", "INV-0002"})
		return err
	})
	switch {
	case errors.Is(err, fencing.ErrMutationUnknown):
		// The answer was lost: ask the resource before anything else.
		l, _ := store.Lookup(ctx, seg.Key(), seg.Root, seg.Seq, seg.Fence)
		fmt.Println("after a lost answer:", l.State)
	case errors.Is(err, fencing.ErrStaleOwner):
		fmt.Println("a newer owner took over; stop producing effects")
	case err != nil:
		fmt.Println("not applied:", err)
	case res.Applied:
		fmt.Println("applied, receipt", res.Receipt.ID)
	default:
		fmt.Println("already applied, receipt", res.Receipt.ID)
	}
}
