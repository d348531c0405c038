// Package lockgrant is the LockGrant controller: for each resource it keeps
// a FIFO queue of LockGrants, grants them one at a time, issues each a fence
// by compare-and-swap on the resource's FenceCounter, and ends them when
// they are released, expire or time out.
//
// One reconcile request is one resource (namespace + FenceCounter name), so
// every decision about a resource is taken by one worker at a time, on one
// consistent set of facts: gather (grants and counter from the cache, with
// this replica's own writes in place of older copies; ownwrites.go),
// decide (the pure internal/grantplan), apply (the counter by
// compare-and-swap, which validates the cached counter; a Conflict decides
// again on a direct read). Each changed status is then written once by the
// resource's status writer, after the pass (statuses.go), under the
// status's transition rules.
//
// Guarantees, given that only this controller writes FenceCounters and
// LockGrant status:
//   - fences of a resource strictly increase and are never reused: a fence
//     is taken by raising FenceCounter.spec.fence with a resourceVersion
//     precondition, and admission refuses to lower it;
//   - at most one grant is the counter's holder; a grant is Held only while
//     it is the holder and its lease has not expired by the controller's clock;
//   - a crash between the counter write and the status write converges to
//     the same fence: the holder recorded in the counter is marked Held with
//     the counter's fence, never issued a second one;
//   - expiresAt is read back from status after a restart or failover, so a
//     new leader never expires a grant earlier than the old one would have
//     (up to clock skew between their nodes).
package lockgrant
