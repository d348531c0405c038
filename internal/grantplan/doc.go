// Package grantplan is the grant state machine of the server side: given
// what the registry holds for one resource (its grants, its FenceCounter,
// the issuer epoch, the policies) and the controller's clock, Decide says
// what must change. It is pure, so the LockGrant controller applies its plans
// to the API server and the fault simulation drives it directly.
//
// Guarantees of a plan, given facts read as the controller reads them (the
// counter and the holder directly from the API server):
//   - at most one grant is the holder; a new holder is chosen only when no
//     holder is live, first in FIFO order of admission;
//   - the new fence is fencing.NextFence of the counter's, so it is larger
//     than every fence issued before, in any epoch, and of the issuer's
//     epoch; when the epoch has no such fence (its sequence used up, a
//     counter of a later epoch) nobody is granted, and the head of the
//     queue is told why (SequenceExhausted, EpochBehind);
//   - a grant is expired at its expiresAt (equality included), a waiter past
//     its wait limit is never granted, a renew after expiry fails;
//   - a holder recorded in the counter but not yet marked Held converges to
//     the counter's fence; no second fence is issued for it.
package grantplan
