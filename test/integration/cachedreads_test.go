package integration

import (
	"fmt"
	"testing"
)

// With the manager's default --guard-reads=cached, the holder's writes are
// accepted from the informer's FenceCounter (counted as read "cache"),
// without a read of the API server; after a handoff the successor's first
// write is accepted, and the old holder is then refused by the object's
// recorded fence, whatever the cache shows.
func TestGuardedWritesAcceptedFromTheCache(t *testing.T) {
	ns := namespace(t)
	a, b := as(t, "cached-a"), as(t, "cached-b")
	const obj = "cached-reads"
	const reads = "lockwarden_guarded_write_registry_reads_total"
	ga := mustAcquire(t, a, ns, 60)
	fromCache := metricValue(t, reads, map[string]string{"read": "cache"})
	n := 0
	waitUntil(t, "a write accepted from the cache", func() (bool, error) {
		n++
		if err := write(t, a, ns, obj, ga, fenceOf(ga), fmt.Sprintf("a-%d", n)); err != nil {
			return false, err
		}
		return metricValue(t, reads, map[string]string{"read": "cache"}) > fromCache, nil
	})

	if err := release(t, a, ga); err != nil {
		t.Fatalf("releasing A's grant: %v", err)
	}
	gb := mustAcquire(t, b, ns, 60)
	if err := write(t, b, ns, obj, gb, fenceOf(gb), "b-1"); err != nil {
		t.Fatalf("the successor's first write: %v", err)
	}
	wantReason(t, "A's write after B's", write(t, a, ns, obj, ga, fenceOf(ga), "late"), "STALE_OWNER")
}
