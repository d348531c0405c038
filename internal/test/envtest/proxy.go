package envtest

import (
	"net"
	"sync"
)

// Proxy forwards TCP connections to an upstream address (the API server)
// and simulates a network partition: Partition makes every open connection
// a black hole (bytes vanish, nothing is closed, as when a peer or a NAT
// entry disappears) and refuses new ones; Heal forwards new connections
// again, while the connections cut by the partition stay dead, as they do
// in a real network. Only loopback addresses are used.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu  sync.Mutex
	gen int // partitions so far: a connection of an earlier generation is dead
	cut bool
	// refused counts connections refused during partitions.
	refused int
	conns   []net.Conn
	wg      sync.WaitGroup
}

// StartProxy listens on 127.0.0.1 and forwards to upstream ("host:port").
func StartProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream}
	go p.accept()
	return p, nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Partition cuts every open connection and refuses new ones until Heal.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.gen++
}

// Heal accepts and forwards new connections again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Refused returns how many connections were refused during partitions: a
// client that gave up a dead connection and dialed again.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut, gen := p.cut, p.gen
		p.mu.Unlock()
		if cut {
			p.mu.Lock()
			p.refused++
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up, c, gen)
		go p.pipe(c, up, gen)
	}
}

// pipe copies src to dst while the connection's generation is current, and
// swallows src afterwards.
func (p *Proxy) pipe(dst, src net.Conn, gen int) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			alive := p.gen == gen
			p.mu.Unlock()
			if alive {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}
