package lockgrant

import (
	"sync"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// seenMark is the highest resourceVersion the grants' informer has
// delivered to this controller's event handlers. The informer stores each
// change in its cache before it calls the handlers, and a watch delivers
// changes in the order they were stored, so the cache shows every change
// of a LockGrant stored at or before the mark (grantplan.CacheCovers).
type seenMark struct {
	mu sync.Mutex
	rv string
}

// see raises the mark to rv; a version that is not well formed (which the
// API server does not send) is ignored.
func (m *seenMark) see(rv string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rv == "" {
		if _, err := resourceversion.CompareResourceVersion(rv, rv); err == nil {
			m.rv = rv
		}
		return
	}
	if cmp, err := resourceversion.CompareResourceVersion(rv, m.rv); err == nil && cmp > 0 {
		m.rv = rv
	}
}

// get is the mark; "" before the first change.
func (m *seenMark) get() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rv
}
