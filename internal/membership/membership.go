package membership

import (
	"hash/fnv"
	"slices"
	"time"
)

// Member is one replica as its Lease shows it.
type Member struct {
	// ID is the replica's identity (its Lease's holderIdentity).
	ID string
	// RenewTime is when the replica last renewed its Lease, by its clock.
	RenewTime time.Time
	// Duration is how long the Lease lasts after RenewTime.
	Duration time.Duration
}

// Lapsed reports whether m's Lease has run out at now (equality included):
// the replica stopped renewing, or its clock is behind ours by more than
// the Lease has left.
func (m Member) Lapsed(now time.Time) bool { return !now.Before(m.RenewTime.Add(m.Duration)) }

// Live returns the IDs of the members whose Lease has not lapsed at now,
// with self always among them (a replica that runs is live to itself),
// sorted and without duplicates.
func Live(members []Member, self string, now time.Time) []string {
	ids := []string{self}
	for _, m := range members {
		if m.ID != "" && !m.Lapsed(now) {
			ids = append(ids, m.ID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// Preferred returns the member of live that acts first on key: the one with
// the highest weight hash(member, key) (rendezvous hashing, Thaler and
// Ravishankar 1996). Ties, which need a 64-bit collision, go to the smaller
// ID. It returns "" when live is empty.
func Preferred(key string, live []string) string {
	best, bestWeight := "", uint64(0)
	for _, id := range live {
		w := weight(id, key)
		if best == "" || w > bestWeight || (w == bestWeight && id < best) {
			best, bestWeight = id, w
		}
	}
	return best
}

// PairHash is FNV-1a of a and b with a separator that neither contains, so
// that ("ab", "c") and ("a", "bc") differ. Summed over the objects of a
// resource, it fingerprints the resource's state for Takeover.
func PairHash(a, b string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(a))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(b))
	return h.Sum64()
}

// weight is FNV-1a of the member and the key, with a separator that
// neither contains, so that ("ab", "c") and ("a", "bc") differ, finished
// with a 64-bit mixer so that keys that differ in their last bytes spread
// over the whole range.
func weight(id, key string) uint64 {
	x := PairHash(id, key)
	// splitmix64's finalizer.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
