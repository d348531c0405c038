package main

import (
	"io"
	"net"
	"sync"
	"time"
)

// balancer is the webhook Service of the local setup: a TCP balancer on
// 127.0.0.1 in front of the manager replicas' webhook servers. It passes
// TLS through untouched (every replica serves the same certificate, from the
// rotator's Secret) and sends each connection to the next replica that
// accepts it, so the API server reaches whichever replica is up.
type balancer struct {
	ln       net.Listener
	backends []string

	mu    sync.Mutex
	next  int
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// backendDialTimeout bounds one connection attempt to a replica; a killed
// replica refuses at once, so this only matters for a frozen one.
const backendDialTimeout = time.Second

// startBalancer listens on a free port of 127.0.0.1.
func startBalancer(backends []string) (*balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &balancer{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go b.serve()
	return b, nil
}

// port is the port the balancer listens on.
func (b *balancer) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

func (b *balancer) serve() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return // closed
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.handle(c)
		}()
	}
}

func (b *balancer) handle(client net.Conn) {
	if !b.track(client) {
		return
	}
	defer b.untrack(client)
	b.mu.Lock()
	first := b.next
	b.next = (b.next + 1) % len(b.backends)
	b.mu.Unlock()
	for i := range b.backends {
		addr := b.backends[(first+i)%len(b.backends)]
		upstream, err := net.DialTimeout("tcp", addr, backendDialTimeout)
		if err != nil {
			continue
		}
		if !b.track(upstream) {
			return
		}
		defer b.untrack(upstream)
		done := make(chan struct{}, 2)
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			// Half-close would keep a connection to a dead replica
			// open; close both ways.
			dst.Close()
			src.Close()
			done <- struct{}{}
		}
		go pipe(upstream, client)
		go pipe(client, upstream)
		<-done
		<-done
		return
	}
}

// track registers a connection for close; false when the balancer is
// closed (the connection is then closed).
func (b *balancer) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		c.Close()
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *balancer) untrack(c net.Conn) {
	c.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, c)
}

// close stops listening, closes every connection and waits for the
// goroutines.
func (b *balancer) close() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}
