package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// Timeouts of one step of a measurement.
const (
	queueTimeout = 30 * time.Second
	holdTimeout  = 60 * time.Second
	// settle is how long a waiter has been in line before the holder
	// releases (plus up to settleJitter at random), so that what is
	// measured is the handoff to a waiter that has been waiting, not the
	// tail of its request: the follow-up reconciles of a lockwarden
	// request are over, and etcd has moved the waiter's watch, which starts
	// at a past revision, into its synced set (etcd does that every 100 ms;
	// before, an event waits for that loop).
	settle       = 120 * time.Millisecond
	settleJitter = 30 * time.Millisecond
)

// handoffs measures n handoffs of resource between two clients: the holder
// releases while the other waits in line; a sample is from the release call
// to the waiter observing itself holding. With fences (lockwarden), it
// checks that each handoff issued a higher fence. For lockwarden, whose
// client follows its counter, status (when set) gets the time from the
// release call to the waiter's client seeing its grant's status Held: what
// a program that consumes grant status sees. hook, when set, runs around
// each release (for the path breakdown).
func handoffs(ctx context.Context, a, b lockClient, resource string, n int, s, status *series, hook handoffHook) error {
	clients := [2]lockClient{a, b}
	cur, err := a.Request(ctx, resource)
	if err != nil {
		return err
	}
	if err := cur.waitHeld(ctx, holdTimeout); err != nil {
		return fmt.Errorf("first acquisition of %s: %w", resource, err)
	}
	for i := range n {
		next, err := clients[(i+1)%2].Request(ctx, resource)
		if err != nil {
			return err
		}
		if err := next.waitQueued(ctx, queueTimeout); err != nil {
			return fmt.Errorf("handoff %d of %s: %w", i, resource, err)
		}
		if err := sleep(ctx, settle+rand.N(settleJitter)); err != nil {
			return err
		}
		if hook != nil {
			if err := hook.before(ctx, i); err != nil {
				return err
			}
		}
		t0 := time.Now()
		if err := cur.release(ctx); err != nil {
			return fmt.Errorf("handoff %d of %s: %w", i, resource, err)
		}
		released := time.Now()
		if err := next.waitHeld(ctx, holdTimeout); err != nil {
			return fmt.Errorf("handoff %d of %s: %w", i, resource, err)
		}
		if next.heldAt.Before(t0) {
			return fmt.Errorf("handoff %d of %s: the waiter held before the holder released", i, resource)
		}
		if cur.fence != 0 && next.fence <= cur.fence {
			return fmt.Errorf("handoff %d of %s: fence %d after fence %d", i, resource, next.fence, cur.fence)
		}
		s.add(next.heldAt.Sub(t0))
		if status != nil && next.status != nil {
			if err := next.waitStatusHeld(ctx, holdTimeout); err != nil {
				return fmt.Errorf("handoff %d of %s: %w", i, resource, err)
			}
			status.add(next.statusAt.Sub(t0))
		}
		if hook != nil {
			if err := hook.after(ctx, t0, released, cur, next); err != nil {
				return err
			}
		}
		cur = next
	}
	return cur.release(ctx)
}

// handoffHook observes each handoff of a traced series.
type handoffHook interface {
	before(ctx context.Context, i int) error
	after(ctx context.Context, t0, released time.Time, cur, next *ticket) error
}

// expiries measures rounds of expiry handoffs: a holder (whose client makes
// leases that can lapse) acquires, the waiter gets in line, the holder
// vanishes without releasing; a sample is from the holder's expiresAt, as
// its lock system recorded it, to the waiter observing itself holding.
// hold is how long the holder holds before it vanishes (at random up to
// twice that), so that a renewing holder (leader election) renews.
func expiries(ctx context.Context, holder, waiter lockClient, resource string, rounds int, hold time.Duration, s *series) error {
	for i := range rounds {
		// A random pause, so that rounds do not lock into step with a
		// lock system's periodic work (etcd checks lease expiry every
		// 500 ms; leader election retries every retry period).
		if err := sleep(ctx, rand.N(500*time.Millisecond)); err != nil {
			return err
		}
		h, err := holder.Request(ctx, resource)
		if err != nil {
			return err
		}
		if err := h.waitHeld(ctx, holdTimeout); err != nil {
			return fmt.Errorf("expiry round %d of %s: holder: %w", i, resource, err)
		}
		w, err := waiter.Request(ctx, resource)
		if err != nil {
			return err
		}
		if err := w.waitQueued(ctx, queueTimeout); err != nil {
			return fmt.Errorf("expiry round %d of %s: %w", i, resource, err)
		}
		if hold > 0 {
			if err := sleep(ctx, hold+rand.N(hold)); err != nil {
				return err
			}
		}
		expiresAt, err := h.vanish(ctx)
		if err != nil {
			return fmt.Errorf("expiry round %d of %s: %w", i, resource, err)
		}
		if err := w.waitHeld(ctx, holdTimeout); err != nil {
			return fmt.Errorf("expiry round %d of %s: waiter: %w", i, resource, err)
		}
		s.add(w.heldAt.Sub(expiresAt))
		if err := w.release(ctx); err != nil {
			return err
		}
	}
	return nil
}

// cycles runs one worker per resource, each acquiring and releasing its
// resource as fast as it can for window (after one warm-up cycle each), and
// returns the cycles completed per second; each cycle's latency (request to
// release returned) goes to lat.
func cycles(ctx context.Context, clients []lockClient, resources []string, window time.Duration, lat *series) (float64, error) {
	one := func(ctx context.Context, c lockClient, r string) (time.Duration, error) {
		t0 := time.Now()
		t, err := c.Request(ctx, r)
		if err != nil {
			return 0, err
		}
		if err := t.waitHeld(ctx, holdTimeout); err != nil {
			return 0, fmt.Errorf("cycle on %s: %w", r, err)
		}
		if err := t.release(ctx); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	type result struct {
		n    int
		lat  []time.Duration
		last time.Time
		err  error
	}
	results := make(chan result, len(clients))
	start := make(chan struct{})
	var startAt time.Time
	warm := make(chan error, len(clients))
	for i := range clients {
		go func() {
			_, err := one(ctx, clients[i], resources[i])
			warm <- err
			if err != nil {
				results <- result{err: err}
				return
			}
			<-start
			var r result
			for time.Since(startAt) < window {
				d, err := one(ctx, clients[i], resources[i])
				if err != nil {
					r.err = err
					break
				}
				r.n++
				r.lat = append(r.lat, d)
				r.last = time.Now()
			}
			results <- r
		}()
	}
	var firstErr error
	for range clients {
		if err := <-warm; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	startAt = time.Now()
	close(start)
	total, end := 0, startAt
	for range clients {
		r := <-results
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		total += r.n
		for _, d := range r.lat {
			lat.add(d)
		}
		if r.last.After(end) {
			end = r.last
		}
	}
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / end.Sub(startAt).Seconds(), nil
}
