package main

import (
	"context"
	"fmt"
	"time"
)

// workerFaults starts a fault on one worker every 1.5-4 s: a freeze past
// the TTL (one in five), a pause between the validity check and the write
// (three in ten), or a network fault on its path to the API server.
func (c *chaos) workerFaults(ctx context.Context) {
	for sleep(ctx, c.between(minWorkerFaultGap, maxWorkerFaultGap)) == nil {
		r := c.float()
		switch {
		case r < 0.2:
			c.freeze(ctx)
		case r < 0.5:
			c.pauseAtWrite(ctx)
		case r < 0.65:
			c.netFault(ctx, faultLatency)
		case r < 0.77:
			c.netFault(ctx, faultBlackhole)
		case r < 0.87:
			c.netFault(ctx, faultReset)
		default:
			c.netFault(ctx, faultDown)
		}
	}
}

// pick chooses a worker without a fault, preferring those in prefer, and
// marks it busy; -1 if all are busy.
func (c *chaos) pick(prefer map[string]bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var free, preferred []int
	for i := range c.workers {
		if c.busy[i] {
			continue
		}
		free = append(free, i)
		if prefer[workerName(i)] {
			preferred = append(preferred, i)
		}
	}
	if len(preferred) > 0 {
		free = preferred
	}
	if len(free) == 0 {
		return -1
	}
	i := free[c.rnd.IntN(len(free))]
	c.busy[i] = true
	return i
}

func (c *chaos) release(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.busy, i)
}

// freeze stops a worker, preferably one holding a grant, for longer than
// its TTL, then resumes it.
func (c *chaos) freeze(ctx context.Context) {
	i := c.pick(c.obs.holders())
	if i < 0 {
		return
	}
	wp := c.workers[i]
	d := c.ttl + c.between(minFreezeExtra, maxFreezeExtra)
	if !wp.freeze() {
		c.release(i)
		return
	}
	detail := fmt.Sprintf("freeze %s for %s (SIGSTOP)", wp.name(), d.Round(time.Millisecond))
	c.note(NoteFault, detail)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.release(i)
		_ = sleep(ctx, d)
		wp.thaw()
		c.note(NoteHeal, "thaw "+wp.name()+" (SIGCONT)")
	}()
}

// pauseAtWrite arms a worker that holds a grant to stop itself between its
// last validity check and its next write, and resumes it past the end of
// its lease: the write then reaches admission with a stale fence.
func (c *chaos) pauseAtWrite(ctx context.Context) {
	holders := c.obs.holders()
	i := c.pick(holders)
	if i < 0 {
		return
	}
	wp := c.workers[i]
	if !holders[wp.name()] || !wp.arm() {
		c.release(i)
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.release(i)
		// Wait for the worker to reach its write; it may not write again
		// before the end of the run.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !wp.selfStopped() {
			select {
			case <-ctx.Done():
				wp.disarm()
				wp.selfStopped() // it may have stopped meanwhile
				wp.thaw()
				return
			case <-tick.C:
			}
		}
		d := c.ttl + c.between(minFreezeExtra, maxFreezeExtra)
		c.note(NoteFault, fmt.Sprintf("freeze %s before its write for %s (SIGSTOP by itself)", wp.name(), d.Round(time.Millisecond)))
		_ = sleep(ctx, d)
		wp.thaw()
		c.note(NoteHeal, "thaw "+wp.name()+" (SIGCONT)")
	}()
}

// netFault injects a fault of kind on a worker's path to the API server
// for a few seconds.
func (c *chaos) netFault(ctx context.Context, kind string) {
	i := c.pick(nil)
	if i < 0 {
		return
	}
	d := c.between(minNetFault, maxNetFault)
	lat := c.between(minLatency, maxLatency)
	detail := fmt.Sprintf("%s on %s for %s", kind, workerName(i), d.Round(time.Millisecond))
	if kind == faultLatency {
		detail = fmt.Sprintf("latency %s±%s on %s for %s", lat.Round(time.Millisecond), (lat / 4).Round(time.Millisecond), workerName(i), d.Round(time.Millisecond))
	}
	if err := c.net.inject(i, kind, lat.Milliseconds(), lat.Milliseconds()/4); err != nil {
		c.note(NoteFault, "could not inject: "+err.Error())
		c.release(i)
		return
	}
	c.note(NoteFault, detail)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.release(i)
		_ = sleep(ctx, d)
		if err := c.net.heal(i); err != nil {
			c.note(NoteHeal, "could not heal: "+err.Error())
			return
		}
		c.note(NoteHeal, "heal "+workerName(i))
	}()
}
