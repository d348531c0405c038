package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// permitCounts are the counts of permits the permits phase measures.
var permitCounts = []int32{1, 4, 16}

// permitsResult is the throughput of one resource with n permits.
type permitsResult struct {
	permits int32
	workers int
	// rate is acquire+release cycles per second; lat the cycle latency
	// (request to Held to the release call returning), ms.
	rate float64
	lat  summary
}

// permits measures acquire+release cycles per second on one resource with
// N = 1, 4 and 16 permits, each by 2N workers (so that N hold while N
// wait): lockwarden's counted locks, where every grant takes the lowest
// free permit and each permit has its own fence record. There is no
// target; the figures show how the cycle rate grows with the permits.
func (b *bench) permits(ctx context.Context) error {
	for _, n := range permitCounts {
		workers := 2 * int(n)
		resource := fmt.Sprintf("permits-%d", n)
		clients := make([]lockClient, 0, workers)
		closeAll := func() {
			for _, c := range clients {
				c.Close()
			}
		}
		for i := range workers {
			c, err := newLWClient(ctx, b.cp, nsPermits, fmt.Sprintf("p%d-%d", n, i), 60)
			if err != nil {
				closeAll()
				return err
			}
			if n > 1 {
				c.permits = n
			}
			clients = append(clients, c)
		}
		resources := make([]string, workers)
		for i := range resources {
			resources[i] = resource
		}
		lat := &series{system: sysLockwarden, metric: fmt.Sprintf("cycle latency, 1 resource, %d permit(s), %d workers", n, workers)}
		fmt.Printf("    %-32s %d permit(s), %d workers, %s\n", sysLockwarden, n, workers, b.o.window)
		rate, err := cycles(ctx, clients, resources, b.o.window, lat)
		closeAll()
		if err != nil {
			return fmt.Errorf("%d permits: %w", n, err)
		}
		b.res.all = append(b.res.all, lat)
		b.res.permits = append(b.res.permits, permitsResult{permits: n, workers: workers, rate: rate, lat: summarize(lat.ms)})
	}
	return nil
}

// permitsMarkdown renders the permits phase as a table, with each rate's
// ratio to the exclusive lock's (1 permit).
func permitsMarkdown(rs []permitsResult, window time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Counted permits: acquire+release cycles on one resource with N permits and 2N workers, %s each (no target):\n\n", window)
	b.WriteString("| permits | workers | cycles/s | cycle p50 ms | cycle p99 ms | ratio to 1 permit |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var base float64
	for _, r := range rs {
		if r.permits == 1 {
			base = r.rate
		}
	}
	for _, r := range rs {
		rel := ""
		if base > 0 {
			rel = ratio(r.rate, base)
		}
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s |\n", r.permits, r.workers, strconv.FormatFloat(r.rate, 'f', 1, 64),
			ms(r.lat.p50), ms(r.lat.p99), rel)
	}
	return b.String()
}
