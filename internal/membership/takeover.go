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
//     something), or once MaxWait has passed since it first deferred, even
//     if the state kept moving (new requests arriving while the preferred
//     replica is frozen must not starve the others).
//
// A Takeover is safe for concurrent use.
type Takeover struct {
	// Delay is how long the state must stay unchanged before a replica
	// that is not preferred acts.
	Delay time.Duration
	// MaxWait bounds the deferral from the first event; 0 means 3*Delay.
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
	maxWait := t.MaxWait
	if maxWait <= 0 {
		maxWait = 3 * t.Delay
	}
	if now.Sub(d.first) >= maxWait {
		delete(t.pending, key)
		return 0
	}
	if d.state != state {
		// The state moved: someone (the preferred replica, or a client)
		// acted. Give the preferred replica a full delay again.
		d.since, d.state = now, state
		t.pending[key] = d
		return min(t.Delay, d.first.Add(maxWait).Sub(now))
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
