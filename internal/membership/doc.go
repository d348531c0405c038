// Package membership decides which manager replica acts first on a
// resource, so that two replicas do not both do the work of every event.
//
// Each replica renews a short Lease of its own; the replicas whose Lease
// has not lapsed are the live members (Live). Each resource has one
// preferred member, by rendezvous (highest random weight) hashing of the
// resource's key over the live members (Preferred): every replica that
// sees the same members computes the same preferred one, and a member that
// leaves moves only its own resources. The preferred replica acts at once;
// any other replica waits a takeover delay and acts only if the resource's
// state did not move in the meantime (Takeover).
//
// What is guaranteed: nothing about safety. Ownership is an optimisation of
// work only; two replicas acting on one resource at once are serialized by
// the FenceCounter's compare-and-swap, exactly as when every replica acts on
// every event. What it bounds is the wait: a resource whose preferred
// replica is alive but silent (frozen, partitioned, slow) is acted on by
// another replica within the takeover delay after its state last moved, and
// a replica whose Lease lapsed is no longer preferred for anything, so the
// Lease's duration bounds the wait while the state keeps moving. The package does
// no I/O: callers read the Leases and the resource's state and pass them in.
package membership
