package lockgrant

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// ownWrites remembers this replica's own writes until its caches show
// them, as a ReplicaSet controller keeps expectations of the Pods it
// created (kubernetes/kubernetes, pkg/controller/controller_utils.go): a
// pass never decides on a copy older than what this replica itself wrote,
// and the watch event of its own counter write starts no pass.
//
// A counter write is remembered from its compare-and-swap until the
// counter's informer delivers that version (or a later one, or a direct
// read shows another); a status from the moment it is planned, while it
// waits for the status writer, until the grants' informer delivers the
// version the write returned. Informers deliver an object's versions in
// order, so while an entry lasts the cache shows a version before it; the
// entry then stands in for the cache's copy. A relist that skips a version
// would keep an entry forever: entries are forgotten after ownWriteTTL,
// and a counter entry the moment a direct read shows another version.
//
// Nothing here is a decision: a counter decided on is validated by its
// compare-and-swap, a status by the transition rules of the grant's status
// (LockGrantStatus). The entries only spare passes and conflicts.
type ownWrites struct {
	mu       sync.Mutex
	counters map[types.NamespacedName]*ownCounter
	statuses map[types.UID]*ownStatus
	// seq numbers planned statuses, so that a failed write forgets only
	// its own plan, not a newer one.
	seq uint64
}

// ownWriteTTL is how long an entry the informer never confirmed is kept.
const ownWriteTTL = 30 * time.Second

// ownCounter is a counter write of this replica: in flight (written nil),
// or as the compare-and-swap returned it.
type ownCounter struct {
	// replaced is the resourceVersion the write is conditional on; ""
	// for a create.
	replaced string
	// seen are the versions the informer delivered, moving the cache off
	// replaced, while the write was in flight.
	seen    []string
	written *lockingv1alpha1.FenceCounter
	at      time.Time
}

// ownStatus is a grant's status as this replica planned it, from the plan
// to the moment the informer shows the write.
type ownStatus struct {
	status lockingv1alpha1.LockGrantStatus
	seq    uint64
	// inflight: the writer has sent it; seen are the versions the informer
	// delivered meanwhile (the write's own may come before its answer).
	inflight bool
	seen     []string
	// written is the grant's resourceVersion the write returned.
	written string
	at      time.Time
}

// writingCounter records that this replica is about to write counter key
// by compare-and-swap on version replaced ("" to create it).
func (o *ownWrites) writingCounter(key types.NamespacedName, replaced string, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counters == nil {
		o.counters = map[types.NamespacedName]*ownCounter{}
	}
	o.counters[key] = &ownCounter{replaced: replaced, at: now}
}

// wroteCounter records the outcome of the write: c as the API server
// returned it, or nil when it failed.
func (o *ownWrites) wroteCounter(key types.NamespacedName, c *lockingv1alpha1.FenceCounter, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.counters[key]
	switch {
	case w == nil:
	case c == nil || slices.Contains(w.seen, c.ResourceVersion):
		delete(o.counters, key) // failed, or the cache has it already
	default:
		w.written, w.seen, w.at = c.DeepCopy(), nil, now
	}
}

// counter returns what a pass decides on for counter key: this replica's
// own write while the cache (cached, nil when it has none) has not shown
// it yet, else the cached copy. A direct read is passed as cached with
// direct set: it is the truth, and forgets an entry it has moved past.
func (o *ownWrites) counter(key types.NamespacedName, cached *lockingv1alpha1.FenceCounter, direct bool, now time.Time) *lockingv1alpha1.FenceCounter {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.counters[key]
	switch {
	case w == nil || w.written == nil:
		return cached
	case now.Sub(w.at) > ownWriteTTL:
		delete(o.counters, key)
		return cached
	case direct:
		if cached == nil || cached.ResourceVersion != w.written.ResourceVersion {
			delete(o.counters, key) // moved on since
		}
		return cached
	case cached != nil && cached.ResourceVersion == w.written.ResourceVersion:
		return cached
	}
	return w.written.DeepCopy()
}

// sawCounter is told of every counter version the informer delivers
// (newRV, and oldRV for an update). It reports whether the event needs no
// pass: it is this replica's own write, whose pass already decided on it,
// or it moved the counter off the version a write of this replica is
// conditional on while that write is in flight (the write then fails, and
// its pass reads the counter again directly).
func (o *ownWrites) sawCounter(key types.NamespacedName, oldRV, newRV string) (own bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.counters[key]
	switch {
	case w == nil:
		return false
	case w.written == nil:
		if oldRV != w.replaced {
			return false
		}
		w.seen = append(w.seen, newRV)
		return true
	case w.written.ResourceVersion == newRV:
		delete(o.counters, key)
		return true
	case w.written.ResourceVersion == oldRV:
		delete(o.counters, key) // the cache moved past it
	}
	return false
}

// planStatus records a status this replica plans for grant uid and
// returns its sequence number.
func (o *ownWrites) planStatus(uid types.UID, st *lockingv1alpha1.LockGrantStatus, now time.Time) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.statuses == nil {
		o.statuses = map[types.UID]*ownStatus{}
	}
	o.seq++
	o.statuses[uid] = &ownStatus{status: *st.DeepCopy(), seq: o.seq, at: now}
	return o.seq
}

// writingStatus records that plan seq of grant uid is being sent.
func (o *ownWrites) writingStatus(uid types.UID, seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.statuses[uid]; w != nil && w.seq == seq {
		w.inflight = true
	}
}

// wroteStatus records that plan seq of grant uid was written and the
// grant's resourceVersion after it ("" when the write failed).
func (o *ownWrites) wroteStatus(uid types.UID, seq uint64, rv string, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.statuses[uid]
	switch {
	case w == nil || w.seq != seq:
	case rv == "" || slices.Contains(w.seen, rv):
		delete(o.statuses, uid) // failed, or the cache has it already
	default:
		w.inflight, w.seen, w.written, w.at = false, nil, rv, now
	}
}

// sawGrant is told of every grant version the informer delivers (newRV,
// and oldRV for an update; newRV "" for a delete). It forgets the status
// entry that version shows or has moved past.
func (o *ownWrites) sawGrant(uid types.UID, oldRV, newRV string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.statuses[uid]
	switch {
	case w == nil:
	case newRV == "" || (w.written != "" && (w.written == newRV || w.written == oldRV)):
		delete(o.statuses, uid)
	case w.inflight:
		w.seen = append(w.seen, newRV)
	}
}

// grants returns the listed grants with this replica's planned or written
// statuses in place of the ones the cache shows, while it shows none of
// them yet. The list's items may share memory with the cache: an item
// that changes is replaced, never modified.
func (o *ownWrites) grants(list []lockingv1alpha1.LockGrant, now time.Time) []lockingv1alpha1.LockGrant {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.statuses) == 0 {
		return list
	}
	for i := range list {
		w := o.statuses[list[i].UID]
		switch {
		case w == nil:
		case now.Sub(w.at) > ownWriteTTL:
			delete(o.statuses, list[i].UID)
		case w.written != "" && w.written == list[i].ResourceVersion:
		default:
			g := list[i] // a shallow copy; the status is replaced whole
			g.Status = *w.status.DeepCopy()
			list[i] = g
		}
	}
	return list
}

// overlay returns g, read directly, with this replica's status in place
// while it is not written yet; a status already written is in what a
// direct read returns, or was replaced since.
func (o *ownWrites) overlay(g *lockingv1alpha1.LockGrant) *lockingv1alpha1.LockGrant {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.statuses[g.UID]; w != nil && w.written == "" {
		g = g.DeepCopy()
		g.Status = *w.status.DeepCopy()
	}
	return g
}

// wrote reports whether rv is the version this replica's own status write
// of grant uid returned: a direct read that shows it finds the cache
// behind by that write alone.
func (o *ownWrites) wrote(uid types.UID, rv string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.statuses[uid]
	return w != nil && w.written != "" && w.written == rv
}
