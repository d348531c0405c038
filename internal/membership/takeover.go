package membership

import (
	"sync"
	"time"
)

// Takeover decides, for a replica that is not a resource's preferred one,
// when it acts on that resource anyway. It remembers, per resource, when
// the replica first deferred and the resource's state (a fingerprint of
// what the replica's cache shows: resourceVersions of the counter and the
// grants) when it last looked.
//
//   - The preferred replica acts at once.
//   - Another replica defers. It acts once the state has not moved for
//     Delay (the preferred replica, had it been acting, would have written
//     something), or once MaxWait (if set) has passed since it first
//     deferred, even if the state kept moving. Without MaxWait, a state
//     that keeps moving (clients' requests arriving while the preferred
//     replica is frozen) defers until the preferred replica's Lease lapses
//     and it is no longer preferred: the Lease's duration bounds the wait.
//
// A Takeover is safe for concurrent use.
type Takeover struct {
	// Delay is how long the state must stay unchanged before a replica
	// that is not preferred acts.
	Delay time.Duration
	// MaxWait, if positive, bounds the deferral from the first event.
	MaxWait time.Duration

	mu      sync.Mutex
	pending map[string]deferral
}

type deferral struct {
	first, since time.Time
	state        uint64
}

// Wait returns how long to wait before acting on key, 0 to act now.
// preferred says whether this replica is key's preferred one, state is the
// resource's fingerprint as this replica sees it, now this replica's clock.
// A returned 0 forgets key: the next event starts a new deferral.
func (t *Takeover) Wait(key string, preferred bool, state uint64, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if preferred || t.Delay <= 0 {
		delete(t.pending, key)
		return 0
	}
	if t.pending == nil {
		t.pending = map[string]deferral{}
	}
	d, ok := t.pending[key]
	if !ok {
		t.pending[key] = deferral{first: now, since: now, state: state}
		return t.Delay
	}
	capped := t.MaxWait > 0
	if capped && now.Sub(d.first) >= t.MaxWait {
		delete(t.pending, key)
		return 0
	}
	if d.state != state {
		// The state moved: someone (the preferred replica, or a client)
		// acted. Give the preferred replica a full delay again.
		d.since, d.state = now, state
		t.pending[key] = d
		if capped {
			return min(t.Delay, d.first.Add(t.MaxWait).Sub(now))
		}
		return t.Delay
	}
	if quiet := now.Sub(d.since); quiet < t.Delay {
		return t.Delay - quiet
	}
	delete(t.pending, key)
	return 0
}

// Pending returns how many resources the replica is deferring on.
func (t *Takeover) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}
