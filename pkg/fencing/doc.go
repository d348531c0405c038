// Package fencing holds lockwarden's fencing rules: what a write to a
// protected resource must carry, and what the registry must say, for the
// write to be accepted. It is the one place these rules live; the admission
// webhook, the controller and every other enforcement point gather facts and
// call it.
//
// The idea is the fencing token of Kleppmann ("How to do distributed
// locking", 2016), after Chubby's sequencers (Burrows, OSDI 2006): a lease
// only grants the right to try; every grant carries a token that strictly
// increases per resource, and the place where the write lands refuses a token
// older than the newest it has seen or than the resource's current grant.
//
// What is guaranteed: CheckWrite accepts a write only when the caller owns a
// grant for exactly this resource, the write carries that grant's fence, no
// newer fence has been issued or accepted, and the registry reports the grant
// Held and unexpired at the instant given. Every refusal names one Reason.
//
// What is not: the guarantee is only as strong as the enforcement point that
// calls CheckWrite and records the accepted fence in the same atomic write as
// the change itself. A resource that is written without going through such a
// point is not protected. Liveness is judged on the facts passed in: callers
// must read the registry linearizably (a direct read, not a cache).
//
// The package is pure: no I/O, no clock of its own, no Kubernetes client.
package fencing
