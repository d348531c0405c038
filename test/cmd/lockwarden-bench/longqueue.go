package main

import (
	"context"
	"fmt"
	"time"
)

// The long-queue phase's queue: requests in line at the start, and the
// queue lengths its two samples compare.
const (
	longQueueDeep    = 150 // handoffs with more than this many waiting
	longQueueShallow = 20  // handoffs with fewer than this many waiting
	nsLongQueue      = "bench-longqueue"
)

// longQueueResult compares handoffs with a long queue behind them with
// handoffs at the end of the same queue.
type longQueueResult struct {
	deep, shallow             summary
	deepWrites, shallowWrites float64 // API writes per handoff
}

// longQueue puts o.longQueue requests in line on one resource, then releases
// each as soon as it is Held: every handoff is release → next holds. It
// compares the handoffs made with more than longQueueDeep waiting with those
// made with fewer than longQueueShallow, in latency and in API writes per
// handoff (apiserver_request_total, scraped at the samples' boundaries).
func (b *bench) longQueue(ctx context.Context) error {
	n := b.o.longQueue
	if n <= longQueueDeep+1 {
		return fmt.Errorf("the long queue needs more than %d requests, got %d", longQueueDeep+1, n)
	}
	api, err := newAPIScraper(b.cp)
	if err != nil {
		return err
	}
	c, err := newLWClient(ctx, b.cp, nsLongQueue, "line", 600)
	if err != nil {
		return err
	}
	defer c.Close()
	const resource = "long-queue"
	line := make([]*ticket, 0, n)
	for i := range n {
		t, err := getInLine(ctx, c, resource, i == 0)
		if err != nil {
			return fmt.Errorf("long queue, request %d: %w", i, err)
		}
		line = append(line, t)
	}
	deep := &series{system: sysLockwarden, metric: fmt.Sprintf("handoff, > %d waiting (long queue of %d)", longQueueDeep, n)}
	shallow := &series{system: sysLockwarden, metric: fmt.Sprintf("handoff, < %d waiting (long queue of %d)", longQueueShallow, n)}
	var deepStart, shallowStart promScrape
	res := &longQueueResult{}
	for i := 0; i+1 < len(line); i++ {
		waiting := len(line) - i - 1 // behind the holder, before this handoff
		if i == 0 {
			if deepStart, err = api.scrape(ctx); err != nil {
				return err
			}
		}
		if waiting == longQueueShallow-1 {
			if shallowStart, err = api.scrape(ctx); err != nil {
				return err
			}
		}
		t0 := time.Now()
		if err := line[i].release(ctx); err != nil {
			return err
		}
		if err := line[i+1].waitHeld(ctx, holdTimeout); err != nil {
			return fmt.Errorf("long-queue handoff %d: %w", i, err)
		}
		d := line[i+1].heldAt.Sub(t0)
		switch {
		case waiting > longQueueDeep:
			deep.add(d)
		case waiting < longQueueShallow:
			shallow.add(d)
		}
		if waiting == longQueueDeep+1 {
			end, err := api.scrape(ctx)
			if err != nil {
				return err
			}
			res.deepWrites, _ = writesBetween(deepStart, end).per(len(deep.ms))
		}
	}
	end, err := api.scrape(ctx)
	if err != nil {
		return err
	}
	res.shallowWrites, _ = writesBetween(shallowStart, end).per(len(shallow.ms))
	if err := line[len(line)-1].release(ctx); err != nil {
		return err
	}
	b.res.latency(deep, "longqueue")
	b.res.latency(shallow, "longqueue")
	res.deep, res.shallow = summarize(deep.ms), summarize(shallow.ms)
	b.res.longQueue = res
	return nil
}

// getInLine requests resource with c and waits until the request holds it
// (first) or waits in its queue.
func getInLine(ctx context.Context, c *lwClient, resource string, first bool) (*ticket, error) {
	t, err := c.Request(ctx, resource)
	if err != nil {
		return nil, err
	}
	if first {
		err = t.waitHeld(ctx, holdTimeout)
	} else {
		err = t.waitQueued(ctx, queueTimeout)
	}
	return t, err
}
