package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// balancer is the webhook Service of the local setup: a TCP balancer on
// 127.0.0.1 in front of the manager replicas' webhook servers. It passes
// TLS through untouched (every replica serves the same certificate, from the
// rotator's Secret). Like a Service with a readiness probe, it sends a new
// connection only to a replica whose /readyz passed at its last probe
// (every probeEvery), round robin; and, unlike kube-proxy, when a replica
// fails its probe it closes the connections it carries to it, so that the
// API server's kept connections move to a ready replica at once instead of
// timing out one request each. With no replica ready it refuses the
// connection: the webhook call fails and the write is refused (fail
// closed).
type balancer struct {
	ln       net.Listener
	backends []*backendState
	stop     context.CancelFunc

	mu    sync.Mutex
	next  int
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// backend is a replica's webhook address and its probe address.
type backend struct {
	addr, probe string
}

// backendState is a backend, whether it passed its last probe, and the
// connections it carries.
type backendState struct {
	backend
	ready bool
	conns map[net.Conn]struct{}
}

const (
	// backendDialTimeout bounds one connection attempt to a replica.
	backendDialTimeout = time.Second
	// probeEvery and probeTimeout: a frozen replica fails its probe within
	// probeEvery+probeTimeout, a few hundred milliseconds.
	probeEvery   = 200 * time.Millisecond
	probeTimeout = 300 * time.Millisecond
)

// startBalancer listens on a free port of 127.0.0.1 and starts probing.
func startBalancer(backends []backend) (*balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &balancer{ln: ln, stop: cancel, conns: map[net.Conn]struct{}{}}
	for _, be := range backends {
		b.backends = append(b.backends, &backendState{backend: be, conns: map[net.Conn]struct{}{}})
	}
	b.wg.Add(2)
	go func() { defer b.wg.Done(); b.serve() }()
	go func() { defer b.wg.Done(); b.probe(ctx) }()
	return b, nil
}

// port is the port the balancer listens on.
func (b *balancer) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

// probe checks every backend's /readyz every probeEvery, all at once.
func (b *balancer) probe(ctx context.Context) {
	httpc := &http.Client{Timeout: probeTimeout}
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for _, be := range b.backends {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b.setReady(be, readyz(ctx, httpc, be.probe))
			}()
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func readyz(ctx context.Context, httpc *http.Client, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// setReady records a probe's result; a backend that stops being ready has
// its connections closed.
func (b *balancer) setReady(be *backendState, ready bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if be.ready && !ready {
		for c := range be.conns {
			c.Close()
		}
	}
	be.ready = ready
}

// pick returns the next ready backend, round robin, or nil.
func (b *balancer) pick() *backendState {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range b.backends {
		be := b.backends[b.next]
		b.next = (b.next + 1) % len(b.backends)
		if be.ready {
			return be
		}
	}
	return nil
}

func (b *balancer) serve() {
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
	if !b.track(client, nil) {
		return
	}
	defer b.untrack(client, nil)
	be := b.pick()
	if be == nil {
		return // no ready replica: fail closed
	}
	upstream, err := net.DialTimeout("tcp", be.addr, backendDialTimeout)
	if err != nil {
		return
	}
	if !b.track(upstream, be) {
		return
	}
	defer b.untrack(upstream, be)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close would keep a connection to a dead replica open;
		// close both ways.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(upstream, client)
	go pipe(client, upstream)
	<-done
	<-done
}

// track registers a connection for close (and, with be, as one of its
// backend's); false when the balancer is closed (the connection is then
// closed).
func (b *balancer) track(c net.Conn, be *backendState) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		c.Close()
		return false
	}
	b.conns[c] = struct{}{}
	if be != nil {
		be.conns[c] = struct{}{}
	}
	return true
}

func (b *balancer) untrack(c net.Conn, be *backendState) {
	c.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, c)
	if be != nil {
		delete(be.conns, c)
	}
}

// close stops probing and listening, closes every connection and waits
// for the goroutines.
func (b *balancer) close() {
	b.stop()
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}
