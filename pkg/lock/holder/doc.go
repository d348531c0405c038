// Package holder is the holder side of a lockwarden lease as a pure state
// machine: what a process that asked for a LockGrant may believe about its
// own ownership, given only what it sent, when it sent it, and what it read
// back. It does no I/O and has no clock: every input carries the caller's
// monotonic time, so a fault simulation can drive it step by step and the
// lock library (package lock) drives it from a real or injected clock.
//
// # States
//
//	REQUESTED          the acquire was sent; no confirmed validity yet
//	HELD               the grant is ours until the local deadline
//	RENEWING           HELD, with a renew sent and not yet confirmed
//	OWNERSHIP_UNKNOWN  the local deadline passed without proof of a later one
//	EXPIRED            the registry says this acquisition no longer holds
//	                   (its lease or wait ran out, it was revoked or
//	                   deleted, or it is not ours); final
//	RELEASED           the registry ended the acquisition by a release; final
//
//	REQUESTED --granted, deadline ahead--> HELD
//	HELD --renew sent--> RENEWING --renew observed--> HELD
//	HELD, RENEWING --local deadline--> OWNERSHIP_UNKNOWN
//	OWNERSHIP_UNKNOWN --a read proves a later deadline--> HELD
//	any --registry: expired, timed out, revoked, deleted, refused--> EXPIRED
//	any --release accepted, or registry: released--> RELEASED
//
// # The local deadline
//
// The holder never reads a wall clock and never uses the registry's
// status.expiresAt, which is on the controller's clock. Its deadline is
//
//	deadline = sentAt + TTL - margin
//
// where sentAt is the monotonic instant at which the request that the
// registry's extension answered was *sent*: the create whose successful
// response made the grant, or the renew whose renewals value the controller
// has observed. The registry starts the lease (or the extension) after it
// received that request, so the registry's expiry is at least TTL after
// sentAt by the registry's clock. The margin covers the difference in rate
// between the holder's monotonic clock and the controller's: the deadline
// ends no later than the registry's expiry as long as the holder's clock
// runs no slower than (TTL-margin)/TTL of the controller's rate (90% with
// the default margin of TTL/10). A faster holder clock only ends the
// deadline earlier. Wall-clock offsets and jumps do not enter at all.
//
// The controller reads its clock for a lease (a grant or a renew) after
// it read the request it answers, so the lease starts after that request
// was sent, however long the controller pauses in between.
//
// The time a reply arrives is never used: a reply can be delayed by any
// amount, and the lease may have been extended long before it arrives.
//
// # A grant that arrives late
//
// A request that waited in the queue is granted long after its create was
// sent, and the create's send time then leaves little of the TTL: after
// waiting 16 s for a 20 s lease, 2 s. The registry's lease runs a full TTL
// from the grant, but the holder cannot learn when the grant happened
// without comparing clocks. So a grant reported Held RenewInterval or more
// after its create was sent is not Held yet: the machine stays REQUESTED,
// a renew is due at once, and the grant becomes HELD when that renew is
// confirmed, with its deadline counted from the renew's send time. The
// renew was sent after the grant (the holder sends it once it has read the
// grant Held), and the controller extends the lease by a full TTL from an
// instant after it read the renew, so the deadline again ends no later
// than the registry's expiry. The renew is accepted as long as it reaches
// the controller within a TTL of the grant; until then the holder is not
// Valid and gives nothing up. A grant thus starts HELD with at least
// TTL - margin - max(RenewInterval, its first renew's round trip) of
// validity, however long it waited; a long wait costs one renew round trip
// before the grant is usable.
//
// A read that shows the grant still Pending proves nothing about when the
// lease starts: the controller writes the resource's fence record (which
// makes the grant hold) before the grant's status, and starts the lease at
// an instant of its own clock taken before its write lands. Only a request
// the controller must have read before it decides (the create, a renew)
// bounds the lease's start.
// When a renew's outcome is unknown at the deadline the state becomes
// OWNERSHIP_UNKNOWN: the holder must stop producing effects (effects already
// sent are not undone), and the machine leaves that state only through
// Observe, that is by reading the grant, never by assuming success or loss.
//
// # Assumptions
//
// The machine's grant has one renewer, the machine's owner: a renew sent by
// another process for the same grant could be observed as the answer to
// this machine's renew and break the send-time bound. A grant's TTL never
// changes (the API makes leaseDurationSeconds immutable).
//
// The idea of a lease with a holder-side safety margin is Gray and
// Cheriton's (SOSP 1989); the fencing token that makes a late effect
// harmless anyway is Chubby's sequencer (Burrows, OSDI 2006) and
// Kleppmann's fencing token ("How to do distributed locking", 2016). The
// local deadline is only the holder's courtesy: the guarantee comes from the
// enforcement point that checks the fence.
package holder
