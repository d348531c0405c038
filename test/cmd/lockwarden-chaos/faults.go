package main

import (
	"context"
	"fmt"
	"strings"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Kinds of network fault between a worker and the API server.
const (
	// faultLatency delays every chunk both ways by a latency with jitter.
	faultLatency = "latency"
	// faultBlackhole drops every byte both ways and keeps connections open:
	// requests hang until the client's deadline (a partition).
	faultBlackhole = "blackhole"
	// faultReset resets every connection as soon as data flows.
	faultReset = "reset"
	// faultDown stops the proxy: existing connections are closed and new
	// ones refused.
	faultDown = "down"
)

// faultNet is one toxiproxy proxy per worker, in process, on 127.0.0.1, in
// front of the API server: the path on which the chaos driver drops and
// delays the worker's traffic.
type faultNet struct {
	server  *toxiproxy.ApiServer
	proxies []*toxiproxy.Proxy
}

// startFaultNet starts n proxies to upstream (host:port), one per worker.
func startFaultNet(upstream string, n int) (*faultNet, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = workerName(i)
	}
	return startFaultNetFor(upstream, names)
}

// startFaultNetFor starts one proxy to upstream per name.
func startFaultNetFor(upstream string, names []string) (*faultNet, error) {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	f := &faultNet{server: server}
	for _, name := range names {
		p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
		if err := server.Collection.Add(p, true); err != nil {
			f.close()
			return nil, fmt.Errorf("starting the fault proxy of %s: %w", name, err)
		}
		f.proxies = append(f.proxies, p)
	}
	return f, nil
}

// url is the API server URL proxy i serves (worker i's, or replica i's).
func (f *faultNet) url(i int) string { return "https://" + f.proxies[i].Listen }

// inject starts a fault of kind on worker i's path; latencyMillis and
// jitterMillis apply to faultLatency.
func (f *faultNet) inject(i int, kind string, latencyMillis, jitterMillis int64) error {
	p := f.proxies[i]
	switch kind {
	case faultDown:
		p.Stop()
		return nil
	case faultLatency:
		attrs := fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latencyMillis, jitterMillis)
		return addToxics(p, "latency", attrs, "upstream", "downstream")
	case faultBlackhole:
		return addToxics(p, "timeout", `{"timeout":0}`, "upstream", "downstream")
	case faultReset:
		return addToxics(p, "reset_peer", `{"timeout":0}`, "upstream")
	}
	return fmt.Errorf("unknown fault %q", kind)
}

func addToxics(p *toxiproxy.Proxy, typ, attrs string, streams ...string) error {
	for _, s := range streams {
		body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, typ+"-"+s, typ, s, attrs)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			return fmt.Errorf("adding toxic %s to %s: %w", typ, p.Name, err)
		}
	}
	return nil
}

// heal removes every fault from worker i's path.
func (f *faultNet) heal(i int) error {
	p := f.proxies[i]
	p.Toxics.ResetToxics(context.Background())
	if p.Enabled {
		return nil
	}
	if err := p.Start(); err != nil {
		return fmt.Errorf("restarting the fault proxy of %s on %s: %w", p.Name, p.Listen, err)
	}
	return nil
}

// close stops every proxy, closing all connections through them.
func (f *faultNet) close() {
	for _, p := range f.proxies {
		p.Stop()
	}
}
