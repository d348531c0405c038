package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// migrations holds the schema, one file per version: NNNN_name.sql, applied
// in order of NNNN.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migrateLockKey is the advisory lock that serializes concurrent Migrate
// calls (several workers starting at once).
const migrateLockKey = 0x6c6f636b77617264 // "lockward"

// unscopedRecords is the SQLSTATE migration 0002 raises when the tables
// hold records and no legacy scope was declared.
const unscopedRecords = "LWS01"

// The settings migration 0002 reads the legacy scope from.
const (
	legacyClusterSetting   = "lockwarden.legacy_cluster"
	legacyNamespaceSetting = "lockwarden.legacy_namespace"
)

// MigrateOption configures Migrate.
type MigrateOption func(*migrateConfig)

type migrateConfig struct {
	legacy Scope
}

// AdoptLegacyRecords declares the scope of records written before schema
// version 2, which keyed fences by resource ID alone: migration 0002
// assigns every existing row of the four lockwarden tables to this cluster
// and namespace. Declare it only when every such record was written by
// workers of this one cluster and namespace. Without it, Migrate refuses
// to migrate tables that hold records (NO_RESOURCE) and changes nothing:
// a wrong guess could hide receipts, so that a segment takes effect twice,
// or fence history, so that a reissued fence is not noticed. It has no
// effect on an empty database or an already migrated one.
//
// With your own migration tooling, run migration 0002 in a transaction
// that first sets the same values:
//
//	SET LOCAL lockwarden.legacy_cluster = 'prod-eu1';
//	SET LOCAL lockwarden.legacy_namespace = 'billing';
func AdoptLegacyRecords(scope Scope) MigrateOption {
	return func(c *migrateConfig) { c.legacy = scope }
}

// Migration is one schema version shipped with the store.
type Migration struct {
	// Version is the NNNN of the file name.
	Version int
	// Name is the file name, e.g. "0001_segments.sql".
	Name string
	// SQL is the file's content.
	SQL string
}

// Migrations returns the schema versions shipped with the store, in the
// order they are applied, for operators who apply schema changes with
// their own tooling instead of Migrate.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, p := range names {
		name := strings.TrimPrefix(p, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("postgres: migration %s has no version number", name)
		}
		b, err := migrations.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate brings the database's lockwarden schema up to date: it applies,
// each in its own transaction, every shipped migration that the table
// lockwarden_schema_migrations does not list yet. It is safe to call from
// several processes at once (they queue on an advisory lock) and does
// nothing when the schema is current. The tables are created in the first
// schema of the connection's search_path.
//
// Schema version 2 keys every record by cluster, namespace and resource ID.
// Migrating a version 1 database that holds records needs
// AdoptLegacyRecords; without it Migrate returns an error matching
// fencing.ErrNoResource, and the schema stays at version 1, which the store
// cannot use: workers refuse to start until an operator declares the
// scope.
func Migrate(ctx context.Context, db DB, opts ...MigrateOption) error {
	var c migrateConfig
	for _, o := range opts {
		o(&c)
	}
	all, err := Migrations()
	if err != nil {
		return err
	}
	for _, m := range all {
		if err := apply(ctx, db, m, c); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == unscopedRecords {
				err = &fencing.Error{Reason: fencing.ReasonNoResource, Detail: strings.TrimPrefix(pgErr.Message, string(fencing.ReasonNoResource)+": ")}
			}
			return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
		}
	}
	return nil
}

func apply(ctx context.Context, db DB, m Migration, c migrateConfig) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLockKey)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS lockwarden_schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return err
	}
	var done bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM lockwarden_schema_migrations WHERE version = $1)`, m.Version).Scan(&done); err != nil {
		return err
	}
	if done {
		return nil
	}
	// Transaction-local: the legacy scope never outlives this migration.
	if _, err := tx.ExecContext(ctx, `SELECT set_config($1, $2, true), set_config($3, $4, true)`,
		legacyClusterSetting, c.legacy.Cluster, legacyNamespaceSetting, c.legacy.Namespace); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO lockwarden_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
		return err
	}
	return tx.Commit()
}

var _ DB = (*sql.DB)(nil)
var _ DB = (*sql.Conn)(nil)
