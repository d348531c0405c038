package fencing

import (
	"math"
	"strings"
)

// An administrator's way out for a wedged guarded object.
//
// A guarded object accepts a write only under a grant whose fence is at
// least the one it recorded, and lockwarden never lowers a recorded fence.
// An object that recorded a fence of the last issuer epoch (MaxEpoch), above
// every fence the registry has issued for its resource, can therefore never
// be written, deleted or unguarded again: no epoch can be raised above its
// fence. For such an object only, an administrator may override the guard:
//
//  1. an update that sets the annotation locking.lockwarden.io/override to
//     a reason (the override, consumed by that write like a claim) is
//     accepted as it is, whatever else it changes (it may remove the guard
//     label). The object keeps its recorded fence; the record's intent
//     becomes IntentOverride.
//  2. A delete whose resourceVersion precondition is the version that
//     update made is then accepted from an administrator.
//
// The caller must be allowed the verb "override" on the resource
// guardedobjects.locking.lockwarden.io in the object's namespace (the
// enforcement point asks the API server: Override.Authorized). Nobody is
// granted that verb by default. The override never applies to an object a
// grant can still write: a stale holder gains nothing from it, and nor does
// an administrator who would rather skip raising the issuer epoch.

// OverrideVerb and OverrideResource are the RBAC verb and resource (in the
// group locking.lockwarden.io, the object's namespace) an administrator
// needs to override a wedged guarded object.
const (
	OverrideVerb     = "override"
	OverrideResource = "guardedobjects"
)

// IntentOverride is the intent an accepted override records: the object's
// fence stays, and an administrator's delete may follow (see Override).
const IntentOverride = "override"

// Override is an administrator's override of a guarded object, as the
// enforcement point gathered it.
type Override struct {
	// Reason is why the administrator overrides: the text of the override
	// annotation an update sets. A delete, which follows the override's
	// update, carries none.
	Reason string
	// Authorized is true when the caller may override guarded objects in
	// the object's namespace: the API server allows it the verb "override"
	// on guardedobjects.locking.lockwarden.io (a SubjectAccessReview the
	// enforcement point asks).
	Authorized bool
}

// Wedged reports whether an object that accepted fence recorded can never
// be written under a grant again: recorded is of MaxEpoch, so no issuer
// epoch can be raised above it, and the registry has issued no fence at or
// above it for the object's resource (c, nil when it has no record), or
// only the last fence there is (2^63-1), whose holder has ended.
func Wedged(recorded int64, c *Counter) bool {
	switch {
	case recorded <= 0 || EpochOf(recorded) != MaxEpoch:
		return false
	case c == nil || c.Fence < recorded:
		return true
	}
	return c.Fence == math.MaxInt64 && c.HolderUID == ""
}

// checkOverride judges an update that asserts an override, against the
// fence the stored object recorded. On acceptance it returns the record to
// write: the stored one, with intent IntentOverride.
func checkOverride(r GuardedRequest, recorded int64) (Accepted, error) {
	if err := checkOverrider(r, recorded); err != nil {
		return Accepted{}, err
	}
	if strings.TrimSpace(r.Override.Reason) == "" {
		return Accepted{}, refuse(ReasonOverrideRefused, "an override must give its reason as the value of the annotation %s", "locking.lockwarden.io/override")
	}
	return Accepted{Grant: r.Record.Grant, Fence: recorded, Intent: IntentOverride, Proof: r.Record.Proof}, nil
}

// checkOverrider refuses an override by a caller who may not make one
// (ReasonNotOwner) or of an object that is not wedged
// (ReasonOverrideRefused).
func checkOverrider(r GuardedRequest, recorded int64) error {
	if r.Override == nil || !r.Override.Authorized {
		return refuse(ReasonNotOwner, "%q may not override guarded objects in namespace %q: it needs the verb \"override\" on guardedobjects.locking.lockwarden.io (docs/runbook.md, \"An object wedged in the last epoch\")", r.Caller, r.ObjectNamespace)
	}
	if Wedged(recorded, r.Counter) {
		return nil
	}
	switch {
	case recorded == 0:
		return refuse(ReasonOverrideRefused, "the object has accepted no fence it is held to: write it under a grant")
	case EpochOf(recorded) < MaxEpoch:
		e, _ := EpochAbove(recorded)
		return refuse(ReasonOverrideRefused, "the object's fence %s is of issuer epoch %d: raise the FenceIssuer's spec.epoch to %d or more and write it under a grant (docs/runbook.md, \"LockwardenFenceRegression\")", FormatFence(recorded), EpochOf(recorded), e)
	}
	return refuse(ReasonOverrideRefused, "the registry has issued fence %s for resource %q, at or above the object's fence %s: write it under a grant", FormatFence(r.Counter.Fence), r.Resource, FormatFence(recorded))
}
