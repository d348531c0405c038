package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/pgtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// handover is a registry in which the first worker's grant is superseded
// by the second's after the first has written `after` segments.
type handover struct {
	mu       sync.Mutex
	reads    int
	after    int
	w1, w2   fencing.Grant
	resource string
}

func (h *handover) GrantFacts(_ context.Context, _, uid string) (*fencing.Grant, *fencing.Counter, error) {
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
	if err := migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// C11 through the worker: W1 settles two segments and is superseded; its
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
	store := postgres.New(db, reg)

	var out bytes.Buffer
	err = settle(t.Context(), store, holder{owner: "w1", uid: "uid-w1", fence: 1}, b, &out)
	if !errors.Is(err, fencing.ErrStaleOwner) {
		t.Fatalf("W1's settle = %v; want STALE_OWNER at segment 3\n%s", err, out.String())
	}
	out.Reset()
	if err := settle(t.Context(), store, holder{owner: "w2", uid: "uid-w2", fence: 2}, b, &out); err != nil {
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
