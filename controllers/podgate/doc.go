// Package podgate is the controller of lock-gated Pods
// (docs/gated-workloads.md): for each Pod that admission held back behind
// the scheduling gate locking.lockwarden.io/lock, it requests a grant on
// the Pod's behalf, owned by the Pod's ServiceAccount; once the grant is
// Held it writes the grant's name, UID, fence and proof onto the Pod and
// removes the gate in that same write; it renews the grant while the Pod
// runs and its node's heartbeat is live; it releases the grant when the
// Pod finishes or is deleted (withdraws it when the Pod never started);
// and it deletes a Pod whose grant ended while it could run.
//
// One reconcile request is one Pod name: every decision about a Pod and
// the grants of Pods of that name is taken on one set of facts — gather
// (the Pod from a cache of gated Pods only, selected by label; its grants
// from the manager's cache; the node's Lease directly, only when a
// renewal is due), decide (the pure internal/podgate.Decide), apply.
//
// It never writes a LockGrant's status: the lockgrant controller does. It
// changes a grant only as its steward (create, spec.renewals,
// spec.release), which admission allows the manager for the grants of
// gated Pods only. Its writes are conditional (a resourceVersion on the
// Pod's start and the grant's renewal, a UID on every release and
// delete), so replicas that run it at once cost a Conflict, never a
// second start or a lost renewal.
package podgate
