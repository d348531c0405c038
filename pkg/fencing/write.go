package fencing

import (
	"fmt"
	"time"
)

// Write is everything CheckWrite needs to decide on one guarded write,
// gathered by the enforcement point before it decides.
type Write struct {
	// Resource is the resource ID the written object is guarded by.
	Resource string
	// Caller is the authenticated identity making the write.
	Caller string
	// Fence is the fencing token the write carries (see ParseFence).
	Fence int64
	// Recorded is the fence of the last write the object accepted, 0 when
	// it has accepted none.
	Recorded int64
	// Grant is the grant the write names, read from the registry; nil when
	// the registry has no such grant.
	Grant *Grant
	// Counter is the resource's fence record, read from the registry; nil
	// when the registry has none.
	Counter *Counter
	// Now is the enforcement point's clock at admission.
	Now time.Time
}

// CheckWrite decides whether a guarded write is accepted. It returns nil, or
// an *Error naming the first rule the write breaks, in this order:
//
//  0. ReasonNoFence: the fence is not a valid token (below 1).
//  1. ReasonUnknownGrant: the registry has no such grant or no fence record
//     for the resource.
//  2. ReasonBindingMismatch: the grant is for another resource.
//     ReasonFenceNotIssued: the fence is not one an issuer issues (see
//     CheckIssued). ReasonBindingMismatch: the write carries a fence
//     larger than the grant's (a forged or copied token).
//  3. ReasonNotOwner: the caller is not the grant's owner.
//  4. ReasonFenceRegression: the registry names the grant as the holder of
//     the resource with its newest fence, and the object already accepted
//     a larger one (the registry lost fences: a reinstall, a restore from
//     an old snapshot); the refusal says which epoch the issuer must be
//     raised to.
//     ReasonStaleOwner: the fence is lower than one the object already
//     accepted, than the resource's highest issued fence, or than the
//     grant's own fence. A superseded grant is STALE_OWNER even when it has
//     also expired: the resource has moved on to a newer owner.
//  5. ReasonExpired / ReasonNotHeld / ReasonAlreadyEnded / ReasonRevoked: the grant is not
//     Held and unexpired at w.Now, or the registry no longer names it as
//     the resource's holder.
//
// An accepted write's fence must then be recorded on the object in the same
// atomic write; CheckWrite itself changes nothing.
func CheckWrite(w Write) error {
	g, c := w.Grant, w.Counter
	if w.Fence < 1 {
		return refuse(ReasonNoFence, "the write carries no fence")
	}
	if g == nil {
		return refuse(ReasonUnknownGrant, "the registry has no such grant")
	}
	if c == nil {
		return refuse(ReasonUnknownGrant, "the registry has no fence record for resource %q", w.Resource)
	}
	if g.Resource != w.Resource {
		return refuse(ReasonBindingMismatch, "the grant is for resource %q, the object is guarded by %q", g.Resource, w.Resource)
	}
	if err := CheckIssued(w.Fence, g); err != nil {
		return err
	}
	if w.Fence > g.Fence {
		return refuse(ReasonBindingMismatch, "fence %d is not the grant's fence", w.Fence)
	}
	if w.Caller != g.Owner {
		return refuse(ReasonNotOwner, "%q is not the grant's owner %q", w.Caller, g.Owner)
	}
	switch {
	case w.Fence < w.Recorded && c.Fence == w.Fence && c.HolderUID == g.UID:
		return refuse(ReasonFenceRegression, "the object accepted fence %s, above fence %s, the newest the registry has issued for resource %q: the registry lost fences (a reinstall, or a restore from an old snapshot), %s",
			FormatFence(w.Recorded), FormatFence(c.Fence), w.Resource, recoverAdvice(w.Recorded))
	case w.Fence < w.Recorded:
		return refuse(ReasonStaleOwner, "fence %d is older than fence %d already accepted by the object", w.Fence, w.Recorded)
	case w.Fence < c.Fence:
		return refuse(ReasonStaleOwner, "fence %d is older than fence %d issued for resource %q", w.Fence, c.Fence, w.Resource)
	case w.Fence < g.Fence:
		return refuse(ReasonStaleOwner, "fence %d is older than the grant's fence %d", w.Fence, g.Fence)
	}
	switch g.State {
	case StatePending:
		return refuse(ReasonNotHeld, "the grant is still waiting in the queue")
	case StateExpired:
		return refuse(ReasonExpired, "the grant has expired")
	case StateReleased, StateTimedOut:
		return refuse(ReasonAlreadyEnded, "the grant has ended")
	case StateRevoked:
		return refuse(ReasonRevoked, "the issuer revoked the grant")
	}
	if Expired(g.ExpiresAt, w.Now) {
		return refuse(ReasonExpired, "the lease expired at %s", g.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	return CheckHolderOfRecord(*c, w.Resource, g.UID, w.Fence)
}

// CheckHolderOfRecord reports whether resource's fence record c still names
// grant uid, which holds fence, as its holder. It returns nil, or an *Error:
// ReasonStaleOwner once the record has issued a newer fence, ReasonExpired
// once it names another grant or none. A holder that follows its fence
// record judges its own loss with it, as admission judges its writes.
func CheckHolderOfRecord(c Counter, resource, uid string, fence int64) error {
	switch {
	case fence < c.Fence:
		return refuse(ReasonStaleOwner, "fence %d is older than fence %d issued for resource %q", fence, c.Fence, resource)
	case c.HolderUID != uid:
		return refuse(ReasonExpired, "the registry no longer names the grant as the holder of resource %q", resource)
	}
	return nil
}

// CheckIssued refuses (ReasonFenceNotIssued) a fence that no issuer ever
// issued to grant g (nil: only the fence's shape is judged): a value other
// than the grant's fence that equals it as a float64, or sequence 0 of an
// epoch (NextFence never issues it) below the grant's fence. The latter is what a JSON tool that
// reads numbers as floating point (jq, JavaScript) makes of a fence above
// 2^53: rounded, it may even fall into an earlier epoch, which would
// otherwise be refused as REVOKED_EPOCH and mislead.
func CheckIssued(fence int64, g *Grant) error {
	if g == nil {
		g = &Grant{}
	}
	if g.Fence > 0 && fence != g.Fence && float64(fence) == float64(g.Fence) {
		return refuse(ReasonFenceNotIssued, "fence %s is not the grant's fence %s, but equals it as a floating-point number: a tool that reads JSON numbers as float64 (jq, JavaScript) rounded it; copy the fence as text (kubectl get lockgrant -o jsonpath='{.status.fenceToken}')",
			FormatFence(fence), FormatFence(g.Fence))
	}
	// A fence above the grant's is a forged or copied one
	// (ReasonBindingMismatch), whatever its shape.
	if fence > 0 && SequenceOf(fence) == 0 && (g.Fence == 0 || fence < g.Fence) {
		return refuse(ReasonFenceNotIssued, "fence %s has sequence 0 in issuer epoch %d, which is never issued", FormatFence(fence), EpochOf(fence))
	}
	return nil
}

// recoverAdvice says how an operator lets a resource that accepted fence
// recorded take grants again after the registry lost its fences.
func recoverAdvice(recorded int64) string {
	if e, ok := EpochAbove(recorded); ok {
		return fmt.Sprintf("raise the FenceIssuer's spec.epoch to %d or more (hack/next-epoch.sh; docs/runbook.md, \"LockwardenFenceRegression\")", e)
	}
	return fmt.Sprintf("and no issuer epoch is above %d, the last: an administrator must retire the object (docs/runbook.md, \"An object wedged in the last epoch\")", MaxEpoch)
}
