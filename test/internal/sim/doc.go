// Package sim is lockwarden's deterministic fault simulation: the fault
// gate a release must pass (docs/faults.md). One round plays a few workers contending for a resource
// on a virtual clock, with a seeded scheduler and injected faults, through
// the code the operator really runs:
//
//   - the server-side grant state machine, internal/grantplan.Decide, with
//     the records it signs (grantplan.Sign);
//   - the holder-side state machine, pkg/lock/holder.Machine;
//   - the verifier, pkg/fencing: CheckGuardedRequest at a guarded object
//     (docs/guarded-writes.md), with AcceptFromCache first on the cached
//     counter of the replica that answers (admission.go), CheckSegment at
//     a segment store, CheckRenew and CheckRelease at the registry.
//
// A guarded object carries what the API server would store: the guard label,
// the claim annotations, the record annotations and a resourceVersion. Each
// request builds the object it asks to store as its client would (a stamped
// apply, a merge patch, an update as read, a forged look-alike, a status
// patch, a scale, an eviction, a delete with or without a precondition); the
// enforcement point gathers what the webhook gathers (the claim after the
// request is applied, the stored claim, the record only when the stored
// object was guarded) and, on acceptance, consumes the claim and writes the
// record in the same write.
//
// What the simulation writes itself is only the plumbing between them — a
// registry that stores what Decide plans, message delivery with delays and
// losses — and an oracle that judges every accepted mutation against the
// history (which grants were issued, when they ended, what each resource
// accepted, and who really sent each request), independently of the
// verifier's own rules: a request that asserts nothing of its own is stale
// unless its sender is the current holder, whatever it inherited.
//
// A round is a pure function of its seed: a failure prints the seed, and
// running that seed again replays it exactly.
package sim
