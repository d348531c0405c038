package fencing

import (
	"strings"
	"time"
)

// AdministerVerb is the RBAC verb on lockgrants that lets an identity change
// the labels, annotations, finalizers or owner references of a grant it does
// not own (for example clear a fence-regression report). Without it, only
// the owner may: a fence-regression report raises an alarm in the owner's
// name.
const AdministerVerb = "administer"

// ForceReleaseVerb is the RBAC verb on lockgrants that lets an identity
// delete (force-release) a live grant it does not own. Owners delete their
// own grants with the ordinary delete verb.
const ForceReleaseVerb = "force-release"

// CheckGrantOwner reports whether requester may create a grant for owner:
// only for itself (ReasonNotOwner otherwise).
func CheckGrantOwner(owner, requester string) error {
	if owner != requester {
		return refuse(ReasonNotOwner, "spec.owner %q must be the requesting user %q (leave it empty to default it)", owner, requester)
	}
	return nil
}

// SessionLease is what a grant request's session Lease looks like when the
// request is made, for CheckSessionLease.
type SessionLease struct {
	// Namespace and Name locate the Lease; UID is the UID the request names.
	Namespace, Name, UID string
	// Found reports whether the Lease exists; the fields below are read only then.
	Found bool
	// ActualUID is the Lease's UID.
	ActualUID string
	// Labeled reports whether the Lease carries the session label.
	Labeled bool
	// Label is the session label's name, for the message.
	Label string
	// HasDuration reports whether the Lease has a lease duration of at least a second.
	HasDuration bool
	// Holder is the Lease's holder identity; HasHolder whether it has one.
	Holder    string
	HasHolder bool
}

// CheckSessionLease reports whether a request by owner may name session
// Lease l: it must exist with the UID the request names
// (ReasonSessionExpired otherwise), carry the session label and a lease
// duration (ReasonInvalidSpec, about spec.session.name), and name the owner
// as its holder (ReasonNotOwner). Whether the session is still live is the
// registry's decision, by its own observations (CheckSession).
func CheckSessionLease(l SessionLease, owner string) error {
	switch {
	case !l.Found:
		return refuse(ReasonSessionExpired, "session Lease %s/%s does not exist", l.Namespace, l.Name)
	case l.ActualUID != l.UID:
		return refuse(ReasonSessionExpired, "session Lease %s/%s has uid %s, not %s: it was replaced", l.Namespace, l.Name, l.ActualUID, l.UID)
	case !l.Labeled:
		return refuse(ReasonInvalidSpec, "Lease %s/%s is not a session: it needs the label %s=true", l.Namespace, l.Name, l.Label)
	case !l.HasDuration:
		return refuse(ReasonInvalidSpec, "session Lease %s/%s has no spec.leaseDurationSeconds", l.Namespace, l.Name)
	case !l.HasHolder || l.Holder != owner:
		return refuse(ReasonNotOwner, "session Lease %s/%s is held by %q, not by the requester %q", l.Namespace, l.Name, l.Holder, owner)
	}
	return nil
}

// CheckGrantMetadata reports whether caller may change the labels,
// annotations, finalizers or owner references of a grant owned by owner
// (changed: the update changes them). The owner may; others only with
// AdministerVerb, which administer reports. administer is asked only when
// the rule needs it (it is an authorization request); its error is
// returned as is. The refusal is ReasonNotOwner.
func CheckGrantMetadata(caller, owner string, changed bool, administer func() (bool, error)) error {
	if caller == owner || !changed {
		return nil
	}
	allowed, err := administer()
	if err != nil {
		return err
	}
	if !allowed {
		return refuse(ReasonNotOwner,
			"%q is not the owner of this grant; changing its labels, annotations, finalizers or owner references needs the %q verb on lockgrants", caller, AdministerVerb)
	}
	return nil
}

// GrantUpdate is what an update of a LockGrant (not its status) does, for
// CheckGrantUpdate.
type GrantUpdate struct {
	// Caller is the requesting identity.
	Caller string
	// Grant is the grant before the update, as the registry reports it
	// (its owner and state; a grant whose owner asked to release is
	// Released).
	Grant Grant
	// Ended reports whether the grant's phase was final before the update.
	Ended bool
	// Renew reports whether the update raises the renew count; Release
	// whether the grant asks to be released after it, ReleaseChanged
	// whether the update is what asks.
	Renew, Release, ReleaseChanged bool
	// Immutable names the metadata the update changes that the registry
	// stamped when the grant was created and that nobody may change (the
	// request time, the owner's groups, the request-ID label and marks).
	Immutable []string
	// MetadataChanged reports whether the update changes the grant's
	// labels, annotations, finalizers or owner references.
	MetadataChanged bool
	// Administer reports whether the caller has AdministerVerb on the
	// grant; asked only when CheckGrantMetadata needs it.
	Administer func() (bool, error)
}

// CheckGrantUpdate reports whether update u of a LockGrant is allowed, as
// admission judges it, without a clock and in this order: no immutable
// metadata changes (ReasonInvalidSpec); metadata changes by others than the
// owner need AdministerVerb (CheckGrantMetadata); a renew must pass
// CheckRenewRequest and a release CheckReleaseRequest. Once a grant has
// ended its owner cannot change it any more (a late renew or a retried
// release is refused with the reason the grant ended); others may change
// its metadata as CheckGrantMetadata allows. Whether the lease was still
// running is judged by the registry when it applies the renew or release.
func CheckGrantUpdate(u GrantUpdate) error {
	if len(u.Immutable) > 0 {
		return refuse(ReasonInvalidSpec, "%s of a LockGrant cannot be changed", strings.Join(u.Immutable, ", "))
	}
	if err := CheckGrantMetadata(u.Caller, u.Grant.Owner, u.MetadataChanged, u.Administer); err != nil {
		return err
	}
	specChanged := u.Renew || u.ReleaseChanged
	switch {
	case !specChanged && u.Caller != u.Grant.Owner:
		return nil // metadata of someone else's grant: allowed above
	case !specChanged && !u.Ended:
		return nil
	case u.Renew:
		return CheckRenewRequest(u.Grant, u.Caller)
	case u.Release:
		return CheckReleaseRequest(u.Grant, u.Caller)
	}
	return nil
}

// GrantDelete is what a delete of a LockGrant involves, for
// CheckGrantDelete. The functions are asked only when the rule needs them,
// in the order below, so that an owner's delete costs no read.
type GrantDelete struct {
	// Caller is the requesting identity; Owner the grant's owner.
	Caller, Owner string
	// Phase is the grant's phase as the API shows it, for the message;
	// Ended reports whether it is final.
	Phase string
	Ended bool
	// RequestID is the grant's request ID when its user chose it (one a
	// retry could reuse); "" when it has none, or one its client generated
	// or the manager derived from a Pod's UID.
	RequestID string
	// EndedAt is when an ended grant ended (status.endedAt); zero when it
	// has not ended or does not say.
	EndedAt time.Time
	// Now is the registry's clock at the delete, and Window its
	// request-ID window (0: request IDs are recorded nowhere, spent only
	// while their grant is kept): an ended grant's request ID is recorded
	// until EndedAt plus twice Window (SpentRecordKept).
	Now    time.Time
	Window time.Duration
	// Recorded reports whether the namespace's record of spent request
	// IDs holds RequestID for this grant's end; its error is returned as
	// is.
	Recorded func() (bool, error)
	// NamespaceTerminating reports whether the grant's namespace is being
	// deleted.
	NamespaceTerminating func() bool
	// ForceRelease reports whether the caller has ForceReleaseVerb on the
	// grant; its error is returned as is.
	ForceRelease func() (bool, error)
}

// CheckGrantDelete reports whether d may delete the grant: the owner may,
// anyone (with delete rights) may delete an ended grant or one whose
// namespace is being deleted, and otherwise deleting a live grant someone
// else holds is a forced release, which needs ForceReleaseVerb
// (ReasonNotOwner without it). forced reports an allowed forced release.
//
// The owner may not delete its live grant made with a request ID of its
// choosing (ReasonRequestIDLive): the ID would be forgotten with the grant,
// and a retry with it would run the attempt again, whereas a grant that
// ends (spec.release) is recorded as spent before the controller deletes it
// (docs/request-ids.md). A forced release is not refused for it.
func CheckGrantDelete(d GrantDelete) (forced bool, err error) {
	if d.Ended {
		return false, d.checkEnded()
	}
	if d.Caller == d.Owner && d.RequestID == "" || d.NamespaceTerminating() {
		return false, nil
	}
	if d.Caller == d.Owner {
		return false, refuse(ReasonRequestIDLive, "this %s grant was made with request ID %q: deleting it would forget the ID, and a retry with it would run again; release it (spec.release: true) instead, and it is recorded as spent before it is deleted",
			d.Phase, d.RequestID)
	}
	allowed, err := d.ForceRelease()
	if err != nil {
		return false, err
	}
	if !allowed {
		return false, refuse(ReasonNotOwner, "%q is not the owner of this %s grant; deleting it is a forced release, which needs the %q verb on lockgrants",
			d.Caller, d.Phase, ForceReleaseVerb)
	}
	return true, nil
}

// checkEnded is CheckGrantDelete for an ended grant: anyone with delete
// rights may delete it, unless it was made with a request ID of its user's
// choosing that is still to be recorded as spent (ReasonRequestIDLive): the
// grant is then the ID's only record, and deleted before the registry
// records the ID, it would take the ID with it and a retry would run the
// attempt again. The registry records the ID before it deletes the grant
// itself; a namespace being deleted takes its grants and their record
// together.
func (d GrantDelete) checkEnded() error {
	if d.RequestID == "" || d.Window <= 0 || d.EndedAt.IsZero() || !d.Now.Before(SpentRecordKept(d.EndedAt, d.Window)) {
		return nil
	}
	if d.NamespaceTerminating() {
		return nil
	}
	recorded, err := d.Recorded()
	if err != nil || recorded {
		return err
	}
	return refuse(ReasonRequestIDLive, "this %s grant was made with request ID %q, which stays spent until %s and is not recorded as spent yet: deleting the grant now would forget the ID, and a retry with it would run again; the controller records the ID before it deletes the grant when its retention ends",
		d.Phase, d.RequestID, d.EndedAt.Add(d.Window).UTC().Format(time.RFC3339))
}

// SpentRecordKept is until when the record of a request ID whose grant
// ended at ended is kept with request-ID window window: the window, in
// which a retry is refused, then as long again, in which a retry is
// admitted with a warning.
func SpentRecordKept(ended time.Time, window time.Duration) time.Time {
	return ended.Add(2 * window)
}
