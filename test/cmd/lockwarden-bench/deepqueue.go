package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// queueDepth is how many waiters are in line in the deep-queue series.
const queueDepth = 8

// deepQueue measures lockwarden handoffs with queueDepth waiters in line
// (FIFO): the head waiter gets the lock, and each released client gets back
// in line at the tail. It also counts, from the API server's metrics, the
// requests the series cost per handoff: with a queue, every handoff moves
// every waiter's status.queuePosition.
func (b *bench) deepQueue(ctx context.Context, n int) error {
	clients := make([]*lwClient, queueDepth+1)
	for i := range clients {
		c, err := newLWClient(ctx, b.cp, nsHandoff, fmt.Sprintf("q%d", i), 60)
		if err != nil {
			return err
		}
		defer c.Close()
		clients[i] = c
	}
	const resource = "deep-queue"
	type inLine struct {
		c *lwClient
		t *ticket
	}
	var line []inLine
	for i, c := range clients {
		t, err := getInLine(ctx, c, resource, i == 0)
		if err != nil {
			return fmt.Errorf("deep queue, request %d: %w", i, err)
		}
		line = append(line, inLine{c, t})
	}
	api, err := newAPIScraper(b.cp)
	if err != nil {
		return err
	}
	before, err := api.scrape(ctx)
	if err != nil {
		return err
	}
	s := &series{system: sysLockwarden, metric: fmt.Sprintf("handoff, %d waiters in line", queueDepth)}
	for i := range n {
		if err := sleep(ctx, settle+rand.N(settleJitter)); err != nil {
			return err
		}
		holder, next := line[0], line[1]
		t0 := time.Now()
		if err := holder.t.release(ctx); err != nil {
			return err
		}
		if err := next.t.waitHeld(ctx, holdTimeout); err != nil {
			return fmt.Errorf("deep-queue handoff %d: %w", i, err)
		}
		s.add(next.t.heldAt.Sub(t0))
		t, err := holder.c.Request(ctx, resource)
		if err != nil {
			return err
		}
		if err := t.waitQueued(ctx, queueTimeout); err != nil {
			return fmt.Errorf("deep-queue handoff %d: %w", i, err)
		}
		line = append(line[1:], inLine{holder.c, t})
	}
	after, err := api.scrape(ctx)
	if err != nil {
		return err
	}
	for _, w := range line {
		if err := w.t.release(ctx); err != nil {
			return err
		}
	}
	b.res.latency(s, "handoff-deep")
	d := delta(before, after)
	statusPuts := d.sum("apiserver_request_total", map[string]string{"resource": "lockgrants", "subresource": "status", "verb": "PUT"})[""]
	b.res.deepStatusPuts = statusPuts / float64(n)
	w := writesBetween(before, after)
	b.res.deepWrites, b.res.deepDetail = w.per(n)
	b.res.deepConflicts = w.conflictsPer(n)
	return nil
}
