package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The fault schedule. Worker faults start every 1.5-4 s, one at a time per
// worker; a manager replica is killed about every --manager-kill-every.
const (
	minWorkerFaultGap = 1500 * time.Millisecond
	maxWorkerFaultGap = 4 * time.Second
	minNetFault       = 2 * time.Second
	maxNetFault       = 7 * time.Second
	minLatency        = 300 * time.Millisecond
	maxLatency        = 2500 * time.Millisecond
	// minFreezeExtra, maxFreezeExtra: a frozen worker stays frozen TTL plus this long,
	// past the end of its lease.
	minFreezeExtra = time.Second
	maxFreezeExtra = 4 * time.Second
	minManagerDown = 3 * time.Second
	maxManagerDown = 8 * time.Second
	// failoverTimeout is how long a new leader may take after the leader
	// was killed: the Lease (15 s) plus a generous margin for a loaded
	// machine. Beyond it the run fails: the manager cannot fail over.
	failoverTimeout = 90 * time.Second
)

// Extra chaos notes.
const (
	// NoteFailover (chaos): after the leader was killed, the Lease names a
	// new leader (Detail).
	NoteFailover = "failover"
	// NoteFailoverTimeout (chaos): no new leader within failoverTimeout.
	NoteFailoverTimeout = "failover-timeout"
	// NoteManagerNotReady (chaos): a restarted replica did not become ready.
	NoteManagerNotReady = "manager-not-ready"
)

// chaos is the fault driver.
type chaos struct {
	rnd       *rand.Rand
	rec       *recorder
	out       io.Writer
	workers   []*workerProc
	net       *faultNet
	mnet      *faultNet // the replicas' paths to the API server
	replicas  []*replica
	obs       *observer
	admin     client.Client
	ttl       time.Duration
	killEvery time.Duration

	mu   sync.Mutex
	busy map[int]bool
	wg   sync.WaitGroup
}

// run injects faults until ctx ends, then heals everything: thaws every
// worker, removes every network fault, and has both replicas running.
func (c *chaos) run(ctx context.Context) {
	c.busy = map[int]bool{}
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); c.workerFaults(ctx) }()
	go func() { defer loops.Done(); c.managerFaults(ctx) }()
	loops.Wait()
	c.wg.Wait() // every timed fault healed itself when ctx ended
}

func (c *chaos) note(op, detail string) {
	c.rec.emit(Event{Kind: EventNote, Op: op, Detail: detail})
	fmt.Fprintf(c.out, "    %s  %-9s %s\n", time.Now().Format("15:04:05.000"), op, detail)
}

// between returns a random duration in [lo, hi).
func (c *chaos) between(lo, hi time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return lo + time.Duration(c.rnd.Int64N(int64(hi-lo)))
}

// float returns a random number in [0, 1).
func (c *chaos) float() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rnd.Float64()
}

// jitter returns d scaled by a random factor in [0.6, 1.4).
func (c *chaos) jitter(d time.Duration) time.Duration {
	return c.between(d*6/10, d*14/10)
}
