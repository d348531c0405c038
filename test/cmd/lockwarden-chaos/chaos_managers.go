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
	switch f := c.float(); {
	case f < 0.3:
		c.freezeReplica(ctx, r)
		return
	case f < 0.55:
		c.partitionReplica(ctx, r)
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
	c.note(NoteReplicaDown, r.name()+" kill")
	killedAt := time.Now()
	r.kill(sig)
	if target == leader {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.awaitFailover(oldLeader, killedAt)
		}()
	}
	_ = sleep(ctx, c.between(minManagerDown, maxManagerDown))
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

// Notes on the replicas' health, from the driver's own schedule: a replica
// is down from the start of a fault (Detail "manager-N kill|freeze|
// partition") until it is ready again (Detail "manager-N").
const (
	NoteReplicaDown = "replica-down"
	NoteReplicaUp   = "replica-up"
)

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
	c.note(NoteReplicaUp, r.name())
}

// partitionReplica cuts a replica off the API server (its fault proxy holds
// every byte both ways, connections stay open) for longer than its Lease,
// then restores the path. The other replica must take over its resources
// and answer admission; the cut-off replica fails its readiness once it
// cannot renew its Lease, so the balancer stops sending it writes.
func (c *chaos) partitionReplica(ctx context.Context, r *replica) {
	if !r.running() {
		return
	}
	c.note(NoteFault, fmt.Sprintf("partition %s from the API server", r.name()))
	c.note(NoteReplicaDown, r.name()+" partition")
	if err := c.mnet.inject(r.index, faultBlackhole, 0, 0); err != nil {
		c.note(NoteManagerNotReady, err.Error())
	}
	_ = sleep(ctx, c.between(minManagerDown, maxManagerDown))
	if err := c.mnet.heal(r.index); err != nil {
		c.note(NoteManagerNotReady, err.Error())
		return
	}
	c.note(NoteHeal, "restore "+r.name()+"'s path to the API server")
	c.awaitReplica(ctx, r)
}

// awaitReplica waits until a replica that was frozen or cut off is ready
// again (or starts it again if it exited meanwhile), and notes it up.
func (c *chaos) awaitReplica(ctx context.Context, r *replica) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failoverTimeout)
	defer cancel()
	if !r.running() {
		c.restart(wctx, r)
		return
	}
	if err := r.waitReady(wctx, c.admin); err != nil {
		c.note(NoteManagerNotReady, err.Error())
		return
	}
	c.note(NoteReplicaUp, r.name())
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
