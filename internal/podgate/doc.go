// Package podgate is the pure part of lock-gated Pods
// (docs/gated-workloads.md): what a Pod's lock annotations ask for
// (ParseRequest), the grant the manager requests on its behalf (GrantFor),
// the facts admission checks that grant against (BoundPodOf), and what the
// manager does next for one Pod (Decide). It does no I/O; the admission
// webhooks (webhook/gatedpod, webhook/lockgrant) and the controller
// (controllers/podgate) gather the facts, and the fault simulation plays
// Decide against lost writes and lost nodes.
//
// What is guaranteed, given that the controller applies a Plan as it
// says: a gated Pod loses its scheduling gate only in the write that also
// puts its Held grant's fence, name, UID and proof on it, so no container of
// it starts without them; a grant is renewed only while its Pod exists, has
// not finished, and its node's heartbeat is live; a Pod whose grant ends
// while it still runs is deleted. What is not: a Pod keeps running until
// its containers stop, and a node that is cut off stops nothing at all;
// what protects a resource from such a Pod's late writes is the fence,
// checked where the write lands (the guarded-write webhook, a store that
// verifies it), never the deletion.
package podgate
