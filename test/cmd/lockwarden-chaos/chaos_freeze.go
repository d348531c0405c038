package main

import (
	"context"
	"fmt"
	"syscall"
)

// freezeReplica stops a replica with SIGSTOP past every lease and webhook
// timeout, as a stalled VM or a long GC pause would, then resumes it. The
// other replica must go on granting, expiring and answering admission.
func (c *chaos) freezeReplica(ctx context.Context, r *replica) {
	r.mu.Lock()
	m := r.m
	r.mu.Unlock()
	if m == nil || m.Running() != nil {
		return
	}
	c.note(NoteFault, fmt.Sprintf("freeze %s with SIGSTOP", r.name()))
	c.note(NoteReplicaDown, r.name()+" freeze")
	if err := m.Process().Signal(syscall.SIGSTOP); err != nil {
		return
	}
	_ = sleep(ctx, c.between(minManagerDown, maxManagerDown))
	_ = m.Process().Signal(syscall.SIGCONT)
	c.note(NoteHeal, fmt.Sprintf("thaw %s with SIGCONT", r.name()))
	c.awaitReplica(ctx, r)
}
