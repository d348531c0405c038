package postgres

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// migrations holds the schema, one file per version: NNNN_name.sql, applied
// in order of NNNN.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migrateLockKey is the advisory lock that serializes concurrent Migrate
// calls (several workers starting at once).
const migrateLockKey = 0x6c6f636b77617264 // "lockward"

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
func Migrate(ctx context.Context, db DB) error {
	all, err := Migrations()
	if err != nil {
		return err
	}
	for _, m := range all {
		if err := apply(ctx, db, m); err != nil {
			return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
		}
	}
	return nil
}

func apply(ctx context.Context, db DB, m Migration) error {
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
