// Package postgres is a fenced-write store for PostgreSQL: the enforcement
// point of lockwarden's fencing rules (pkg/fencing's CheckSegment) for data
// that lives in a database rather than in Kubernetes objects. The resource
// checks the fencing token itself, as Kleppmann's "How to do distributed
// locking" (2016) asks of a storage service.
//
// A worker that holds a LockGrant writes a long operation as segments. For
// each segment, Store.Apply runs, in ONE transaction: a lock on the
// resource's fence row, a linearizable read of the grant from the registry,
// the decision of fencing.CheckSegment, and then either the caller's own
// mutation plus a receipt and the raised fence, or nothing. A resend of an
// accepted segment returns the original receipt without running the
// mutation again. A resend with another payload is quarantined
// (lockwarden_quarantine), never applied. A fence regression is refused,
// recorded (lockwarden_fence_alarms), counted and reported to a hook, and
// the recorded fence is never lowered; triggers refuse any UPDATE that
// lowers it and any DELETE or TRUNCATE of the fence and receipt tables.
//
// # Scope
//
// Fences increase per cluster, namespace and resource ID: a FenceCounter
// lives in its grants' namespace, and two lockwarden installations issue
// fences independently. Every record (fence row, receipt, quarantined
// payload, alarm) is therefore keyed by the issuing cluster (WithCluster),
// the segment's namespace (Segment.Namespace) and the resource ID, and the
// Registry is asked for the grant and counter of that namespace. The same
// resource ID in two namespaces or two clusters has two independent
// ledgers. A store without a cluster, or a segment without a namespace,
// is refused NO_RESOURCE. Schema version 1 keyed records by resource ID
// alone; migrating such a database needs the scope its records belong to
// (AdoptLegacyRecords), and Migrate refuses, changing nothing, without it.
//
// # Concurrency
//
// Apply takes a row lock (SELECT ... FOR UPDATE) on the resource's row in
// lockwarden_fences, at READ COMMITTED. Every segment of one resource (in
// one scope) queues on that row, and the second writer reads the first one's
// committed ledger once the lock is granted, so the decision always sees
// the latest fence. This was chosen over SERIALIZABLE because the whole
// decision depends on one row per resource: a row lock serializes exactly
// those writers, never fails with a serialization error, and so never
// re-runs the caller's mutation, which then need not be safe to retry.
// Writers of different resources do not wait for each other. The caller's
// mutation runs at READ COMMITTED inside the same transaction; rows that
// only fenced writers of one resource change are protected by that
// resource's lock.
//
// # Outcomes
//
// Apply returns a Result (Applied, or a resend answered with the original
// receipt), or an error:
//   - *Refusal, which unwraps to a *fencing.Error and its sentinel
//     (errors.Is(err, fencing.ErrStaleOwner), fencing.ErrSequenceGap, ...);
//   - an error matching fencing.ErrMutationUnknown when the commit was sent
//     but its answer was lost: look the receipt up with Lookup;
//   - any other error: nothing was applied.
//
// # What is and is not guaranteed
//
// Given that every writer of the resource's data goes through Apply, the
// fences a resource accepts never decrease, a segment has at most one
// effect, and a segment is applied only when it is the next of its
// operation under the resource's highest fence and the registry reports its
// grant Held by the caller. The guarantee is only as strong as that
// premise: a transaction that changes the same rows without Apply is not
// fenced. The store trusts the Caller it is given and its Registry: it
// runs in the writer's process; a check that does not trust the writer
// needs the issuer's signed grant proof (fencing.CheckProvenWrite).
//
// The idea is the fencing token of Kleppmann ("How to do distributed
// locking", 2016) and Chubby's sequencer (Burrows, OSDI 2006), checked and
// recorded atomically with the write, per segment.
package postgres
