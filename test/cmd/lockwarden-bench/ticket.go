package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// lockClient is one client of one lock system: its own connection and
// identity, as a separate process would have.
type lockClient interface {
	// Request starts acquiring resource and returns at once; the ticket
	// tells when the client waits in line and when it holds.
	Request(ctx context.Context, resource string) (*ticket, error)
	Close()
}

// ticket is one acquisition in progress or held.
type ticket struct {
	queuedOnce sync.Once
	queued     chan struct{} // closed once the request waits in line (or holds)
	doneOnce   sync.Once
	done       chan struct{} // closed once held or failed
	heldAt     time.Time     // when the client observed itself holding
	fence      int64         // lockwarden: the fence it holds with
	name       string        // lockwarden: the grant's name
	err        error
	// status, for a lockwarden ticket, is closed once the client saw its
	// grant's status say Held (statusAt): what a consumer of grant status
	// sees, after the counter the client itself follows. nil for other
	// systems.
	status     chan struct{}
	statusOnce sync.Once
	statusAt   time.Time

	// release gives the lock back, returning when the release call did.
	release func(ctx context.Context) error
	// vanish makes the holder disappear without releasing and returns when
	// its lease expires, by the lock system's own record.
	vanish func(ctx context.Context) (expiresAt time.Time, err error)
	// awaitQueued, when set, replaces waiting on queued.
	awaitQueued func(ctx context.Context) error
}

func newTicket() *ticket {
	return &ticket{queued: make(chan struct{}), done: make(chan struct{})}
}

func (t *ticket) markQueued() { t.queuedOnce.Do(func() { close(t.queued) }) }

// markHeld records the time the client observed itself holding.
func (t *ticket) markHeld(at time.Time, fence int64) {
	t.doneOnce.Do(func() {
		t.heldAt, t.fence = at, fence
		t.markQueued()
		close(t.done)
	})
}

// markStatusHeld records the time the client saw the grant's status Held.
func (t *ticket) markStatusHeld(at time.Time) {
	if t.status == nil {
		return
	}
	t.statusOnce.Do(func() {
		t.statusAt = at
		close(t.status)
	})
}

// waitStatusHeld waits until the client saw the grant's status Held.
func (t *ticket) waitStatusHeld(ctx context.Context, timeout time.Duration) error {
	select {
	case <-t.status:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("status not Held after %s", timeout)
	}
}

func (t *ticket) fail(err error) {
	t.doneOnce.Do(func() {
		t.err = err
		t.markQueued()
		close(t.done)
	})
}

// waitQueued waits until the request waits in line or holds.
func (t *ticket) waitQueued(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if t.awaitQueued != nil {
		if err := t.awaitQueued(ctx); err != nil {
			return fmt.Errorf("waiting in line: %w", err)
		}
		return nil
	}
	select {
	case <-t.queued:
		return t.err
	case <-ctx.Done():
		return fmt.Errorf("waiting in line: %w", ctx.Err())
	}
}

// waitHeld waits until the client holds.
func (t *ticket) waitHeld(ctx context.Context, timeout time.Duration) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("not held after %s", timeout)
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
