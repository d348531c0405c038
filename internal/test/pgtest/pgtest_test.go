package pgtest_test

import (
	"database/sql"
	"os"
	"testing"

	"github.com/lockwarden/lockwarden/internal/test/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// Each Database is a separate, empty database on a real server.
func TestDatabase(t *testing.T) {
	a, b := pgtest.Database(t), pgtest.Database(t)
	if a == b {
		t.Fatalf("two tests share database %s", a)
	}
	db, err := sql.Open("pgx", a)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("fresh database has %d tables", n)
	}
}
