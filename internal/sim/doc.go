// Package sim is lockwarden's deterministic fault simulation: the release
// gate of seed 000. One round plays a few workers contending for a resource
// on a virtual clock, with a seeded scheduler and injected faults, through
// the code the operator really runs:
//
//   - the server-side grant state machine, internal/grantplan.Decide, with
//     the records it signs (grantplan.Sign);
//   - the holder-side state machine, pkg/lock/holder.Machine;
//   - the verifier, pkg/fencing: CheckProvenWrite at a guarded object and
//     CheckSegment at a segment store, CheckRenew and CheckRelease at the
//     registry.
//
// What the simulation writes itself is only the plumbing between them — a
// registry that stores what Decide plans, message delivery with delays and
// losses — and an oracle that judges every accepted mutation against the
// history (which grants were issued, when they ended, what each resource
// accepted), independently of the verifier's own rules.
//
// A round is a pure function of its seed: a failure prints the seed, and
// running that seed again replays it exactly.
package sim
