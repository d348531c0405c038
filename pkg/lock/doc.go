// Package lock is the holder side of lockwarden: Go code that takes a
// fenced lock on a resource, keeps it, proves it on every protected write,
// and stops the moment it can no longer prove it.
//
//	c, _ := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
//	locks := lock.NewClient(c, lock.WithNamespace("billing"))
//	h, err := locks.Acquire(ctx, "invoice-batch/2026-07-19", lock.WithTTL(30*time.Second), lock.WithWait(time.Minute))
//	if err != nil { ... }
//	defer h.Release(context.WithoutCancel(ctx)) // nil, or a refusal: fencing.ErrExpired, ...
//	work := h.Context()           // cancelled when ownership is unknown or lost; context.Cause says why
//	_ = h.Stamp(configMap)        // the fence goes with the write
//	_ = c.Update(work, configMap) // refused by admission if the fence is stale
//
// A lock is one LockGrant (api/v1alpha1): Acquire creates it, named after a
// request ID, and follows it with a watch until the controller grants it.
// The grant's fencing token (Info.Fence) is strictly larger than every
// token issued before for the resource, and every protected write must carry
// it: Handle.Stamp for a guarded Kubernetes object, Handle.NextSegment for a
// segment store. This is Chubby's sequencer (Burrows, OSDI 2006) and
// Kleppmann's fencing token ("How to do distributed locking", 2016).
//
// # What a Handle guarantees
//
//   - One identity per acquisition, and one live holder per grant. A create
//     whose response was lost is retried under the same request ID and
//     finds the same grant. Every grant is bound to the session of the
//     Acquire that made it (a random token, annotation
//     locking.lockwarden.io/session); renewals and the release carry the
//     grant's UID and that token as preconditions (JSON patch tests), so
//     they act on exactly this acquisition, never on a later grant of the
//     same owner, and never from a second process that found the grant by
//     its request ID: that one gets fencing.ErrDriverMismatch, not a lock.
//   - A local deadline that ends no later than the controller's expiry. It
//     is the monotonic time at which the create or the last confirmed renew
//     was sent, plus the TTL, minus a safety margin (default: a tenth of the
//     TTL, at least 1 s, at most half the TTL). Wall clocks, the registry's
//     expiresAt and the arrival time of replies are never used, so clocks
//     that differ in offset or rate do not matter beyond the margin. The
//     handle renews a third of the TTL after each confirmed send, and
//     resends a renew whose outcome is unknown (lost reply, timeout) with
//     the same renewals value, so a retry never renews twice.
//   - Context is cancelled the moment the deadline passes without a
//     confirmed renew (ErrOwnershipUnknown; the handle wakes at the
//     deadline on its clock, and Check judges it exactly), or the registry
//     says the acquisition ended (ErrLost wrapping the refusal, e.g.
//     fencing.ErrExpired: a renew after expiry never re-acquires), or on
//     Release (ErrReleased); context.Cause says which. From the deadline on
//     the handle sends no renew, not even the resend of one whose outcome
//     is unknown; it keeps reading the grant until it is final, which
//     State reports.
//   - Every refusal matches its fencing sentinel (errors.Is with
//     fencing.ErrExpired, fencing.ErrRevoked, ...) and fencing.ReasonOf,
//     whether Acquire, Release or Renew returned it or it is the cause of
//     a handle's Context; every refusal of a renew ends the handle.
//   - Silence: the library logs only to a logger the caller gives it
//     (WithLogger, or the context's logr logger).
//   - A request whose process has died does not hold the resource for a
//     TTL (see Session): each Client keeps a session Lease its requests
//     name, and the registry withdraws the requests and ends the grants of
//     a session that lapsed (its TTL plus 1 s after the last renewal the
//     registry saw). The session's own local deadline, judged like the
//     handle's, spends every handle made under it first.
//
// # What it does not guarantee
//
// Cancelling the Context does not stop effects already sent, and a process
// can be paused between Check and its write for any length of time. Safety
// comes from the enforcement point that checks the fence in the same atomic step
// as the write: the guarded-write admission webhook for Kubernetes objects,
// a segment store for a database. A resource written without such a check
// is not protected, whatever the holder believes. The local deadline is
// only as good as the assumption that the holder's monotonic clock runs at
// least (TTL - margin)/TTL as fast as the controller's (90% with the default
// margin); see package holder.
//
// # A Handle's methods
//
// Info is the acquisition's identity and fence, constant once Acquire
// returned (DriverToken, a credential, is apart from it). Liveness is
// reported two ways, for two uses: Context, cancelled when the lock can no
// longer be proven, for the work to derive its contexts from and
// context.Cause to say why; and Check, a judgement made now with the time
// left, right before an effect or to bound one. State is the holder
// machine's state, for diagnostics: after the Context ended, whether the
// acquisition has ended for good. Stamp, StampDelete, Delete, NextSegment
// and ResumeSegmentsAfter carry the fence into writes; Record, Proof and
// AwaitRecord give the signed record; ReportFenceRegression and Release
// end the list.
//
// # Counted permits
//
// WithPermits(n) makes the lock a semaphore: at most n holders of the
// resource at once (like consul lock -n), with fencing that stays exact.
// The resource is n exclusive slots sharing one FIFO queue, and a grant
// holds one of them: Info.Permit is its number, and Info.FencedResource its
// fenced resource ID, the resource ID itself for slot 0 and "ID#k" for slot
// k. Each slot has its own fence sequence, so Info.Fence is strictly
// larger than every fence issued before for that
// slot, and the signed record names the slot. Stamp binds a guarded object
// to the slot and NextSegment names it, so that an object or a store row
// written under one slot refuses every other slot's fences: what is
// guaranteed per slot is exactly what an exclusive lock guarantees. Work
// that must never run twice at once whatever the slot belongs under an
// exclusive lock, not a permit. Without WithPermits (or with n = 1) the
// lock is exclusive: slot 0, the resource itself, the same as before
// permits existed.
//
// # Tracing
//
// WithTrace reports every step of a Handle as it happens: each holder state
// change with the fence and the local deadline, the end of its Context and
// why, and each renew sent and its answer. lockwarden's chaos suite records
// its workers' beliefs this way and checks them against what the registry
// and the guarded objects recorded; a program can log or export them.
//
// # Reacting to grants
//
// WaitForGrant blocks until a grant satisfies a condition, WatchTransitions
// reports every phase change of a set of grants, and PhaseChanged is a
// controller-runtime predicate for controllers that reconcile LockGrants.
// All of them watch; none polls.
//
// # Leader election
//
// Package election (pkg/lock/election) builds fenced leader election for
// controllers on Acquire: client-go's callbacks, one grant and fence per
// term, a client that stamps every guarded write with the term's claim, and
// a controller-runtime runnable.
package lock
