package postgres_test

import (
	"bytes"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// lossyProxy relays PostgreSQL connections on loopback. Armed, it lets the
// next COMMIT (pgx sends the simple query "commit") through to the server, waits for the server's answer, and
// then cuts the client off without it: the commit happened, but the
// client cannot know.
type lossyProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	// cut is closed once a commit's answer has been dropped.
	cut     chan struct{}
	cutOnce sync.Once
}

func newLossyProxy(t *testing.T, target string) *lossyProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{ln: ln, target: target, cut: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.relay(c)
		}
	}()
	return p
}

func (p *lossyProxy) relay(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	dropping := make(chan struct{})
	answered := make(chan struct{})
	go func() { // server -> client
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			select {
			case <-dropping:
				if n > 0 {
					close(answered)
				}
				return
			default:
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if p.armed.Load() && bytes.Contains(buf[:n], []byte("commit\x00")) && p.armed.CompareAndSwap(true, false) {
				close(dropping)
				_, _ = server.Write(buf[:n])
				<-answered // the server committed (or said why not)
				p.cutOnce.Do(func() { close(p.cut) })
				return // closes the client connection: the answer is lost
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// MUTATION_UNKNOWN: a commit whose answer is lost is reported as unknown,
// and the lookup by operation root and segment then finds the receipt.
// Before a newer fence writes, a segment that never arrived is Unknown;
// after, it is proven Absent.
func TestMutationUnknownAndLookup(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newLossyProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	lossyDB, err := postgres.Open(u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer lossyDB.Close()
	lossy := postgres.New(lossyDB, e.reg, postgres.WithCluster(cluster), postgres.WithClock(e.reg.clk))

	w1 := e.reg.acquire(key, "w1", 10)
	e.mustApply(segment(w1, "P", 1, "p1"))

	proxy.armed.Store(true)
	seg2 := segment(w1, "P", 2, "p2")
	_, err = lossy.Apply(t.Context(), seg2, effect(seg2))
	<-proxy.cut
	if !errors.Is(err, fencing.ErrMutationUnknown) {
		t.Fatalf("Apply() with a lost commit answer = %v; want MUTATION_UNKNOWN", err)
	}
	got, err := e.store.Lookup(t.Context(), key, "P", 2, w1.Fence)
	if err != nil || got.State != fencing.MutationApplied || got.Receipt == nil || got.Receipt.Digest != fencing.PayloadDigest([]byte("p2")) {
		t.Fatalf("Lookup(P, 2) = %+v, %v; want Applied with the receipt of p2", got, err)
	}
	// Reusing the receipt: the resend is answered with it, no second effect.
	res, err := e.apply(seg2)
	if err != nil || res.Applied || res.Receipt != *got.Receipt {
		t.Fatalf("resend after the lookup = %+v, %v; want the looked-up receipt", res, err)
	}

	// Segment 3 never reached the resource. While fence 1 is the highest,
	// a delayed copy could still land: unknown.
	got, err = e.store.Lookup(t.Context(), key, "P", 3, w1.Fence)
	if err != nil || got.State != fencing.MutationUnknown {
		t.Fatalf("Lookup(P, 3) before a newer fence = %+v, %v; want Unknown", got, err)
	}
	// The new owner takes the operation over (its resend of segment 1
	// raises the fence); now fence 1 can never land: absent, redo it.
	e.reg.end(w1.UID, fencing.StateExpired)
	w2 := e.reg.acquire(key, "w2", 10)
	if res, err := e.apply(segment(w2, "P", 1, "p1")); err != nil || res.Applied {
		t.Fatalf("W2's resend of segment 1 = %+v, %v", res, err)
	}
	got, err = e.store.Lookup(t.Context(), key, "P", 3, w1.Fence)
	if err != nil || got.State != fencing.MutationAbsent {
		t.Fatalf("Lookup(P, 3) after fence 2 = %+v, %v; want Absent", got, err)
	}
	e.wantRefused(segment(w1, "P", 3, "p3"), fencing.ReasonStaleOwner)
	e.mustApply(segment(w2, "P", 3, "p3"))
	if _, counts := e.effects(key); len(counts) != 3 || counts["P/2"] != 1 {
		t.Fatalf("effects = %v; want P/1..3 once each", counts)
	}
}
