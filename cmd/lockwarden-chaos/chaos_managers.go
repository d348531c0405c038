package main

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// managerFaults kills a replica, mostly the leader, and starts it again,
// about every killEvery.
func (c *chaos) managerFaults(ctx context.Context) {
	if sleep(ctx, c.jitter(c.killEvery/2)) != nil {
		return
	}
	for ctx.Err() == nil {
		c.killReplica(ctx)
		if sleep(ctx, c.jitter(c.killEvery)) != nil {
			return
		}
	}
}

// killReplica kills one replica (the leader three times in four, SIGKILL
// three times in five, else SIGTERM, which hands leadership over at once),
// waits for a new leader if it was the leader, and starts it again.
func (c *chaos) killReplica(ctx context.Context) {
	leader := -1
	for i, r := range c.replicas {
		if !r.up() {
			return // not both up: skip this round
		}
		if r.leader(ctx) {
			leader = i
		}
	}
	if leader < 0 {
		return
	}
	target := leader
	if c.float() >= 0.75 {
		target = (leader + 1) % len(c.replicas)
	}
	r := c.replicas[target]
	if c.float() < 0.3 {
		c.freezeReplica(ctx, r)
		return
	}
	sig, sigName := syscall.SIGKILL, "SIGKILL"
	if c.float() >= 0.6 {
		sig, sigName = syscall.SIGTERM, "SIGTERM"
	}
	role := "follower"
	if target == leader {
		role = "leader"
	}
	oldLeader, _ := c.obs.currentLeader()
	c.note(NoteFault, fmt.Sprintf("kill %s (%s) with %s", r.name(), role, sigName))
	killedAt := time.Now()
	r.kill(sig)
	if target == leader {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.awaitFailover(oldLeader, killedAt)
		}()
	}
	_ = sleep(ctx, c.between(managerDownMin, managerDownMax))
	c.restart(context.WithoutCancel(ctx), r)
}

// awaitFailover records when the Lease names a holder other than old.
func (c *chaos) awaitFailover(old string, since time.Time) {
	deadline := time.NewTimer(failoverTimeout)
	defer deadline.Stop()
	for {
		cur, changed := c.obs.currentLeader()
		if cur != "" && cur != old {
			c.note(NoteFailover, fmt.Sprintf("new leader %s after %s", cur, time.Since(since).Round(time.Millisecond)))
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			c.note(NoteFailoverTimeout, fmt.Sprintf("no new leader %s after the leader was killed (Lease holder %q)", failoverTimeout, cur))
			return
		}
	}
}

// restart starts a replica and waits until it is ready.
func (c *chaos) restart(ctx context.Context, r *replica) {
	if err := r.start(); err != nil {
		c.note(NoteManagerNotReady, err.Error())
		return
	}
	if err := r.waitReady(ctx, c.admin); err != nil {
		c.note(NoteManagerNotReady, err.Error())
		return
	}
	c.note(NoteHeal, "start "+r.name()+": ready")
}

// ensureReplicas starts every replica that is not running, after the chaos
// phase, and waits until all are ready and one leads.
func (c *chaos) ensureReplicas(ctx context.Context) error {
	for _, r := range c.replicas {
		if !r.running() {
			if err := r.start(); err != nil {
				return err
			}
		}
	}
	for _, r := range c.replicas {
		if err := r.waitReady(ctx, c.admin); err != nil {
			return err
		}
	}
	return waitLeader(ctx, c.replicas)
}
