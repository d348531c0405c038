package fencing

import (
	"time"
)

// SessionMargin is added to a session's duration before the registry
// counts it lapsed. It covers the delay between the client's renewal being
// stored and the registry observing it, and the drift of the two clocks'
// rates over one session duration.
const SessionMargin = time.Second

// Session is what the registry knows about a client's session (a
// coordination.k8s.io/v1 Lease the client renews while it runs), the way
// etcd ties a waiter's key to its session lease and Chubby its handles to
// a session.
//
// The liveness rule judges time by the registry's clock only: ObservedAt is
// when the registry first saw the session's current version, never a time
// the client wrote. A client that renews at least once per Duration, with
// each renewal stored within SessionMargin, is never judged lapsed, however
// far its wall clock is off.
type Session struct {
	// UID is the Lease's UID.
	UID string
	// Holder is the Lease's spec.holderIdentity.
	Holder string
	// Duration is the Lease's spec.leaseDurationSeconds.
	Duration time.Duration
	// ObservedAt is when the registry first observed the Lease's current
	// version (its resourceVersion), by the registry's clock. A registry
	// that restarts observes every session afresh: it may keep a dead
	// session a little longer, never drop a live one earlier.
	ObservedAt time.Time
	// Period is how long before ObservedAt the registry first observed
	// the version before the current one, by its clock: the interval at
	// which the client renews. 0 when the registry has seen one version
	// only.
	Period time.Duration
}

// SessionRenewalsPerDuration is how often a client renews its session per
// session duration: pkg/lock renews every third of it, as etcd's lease
// keepalive does.
const SessionRenewalsPerDuration = 3

// SessionRenewalGrace is how late past its cadence the registry may see a
// session's renewal before a handoff counts its client gone (see
// CheckSessionRenewing). It covers the delay between the client's renewal
// being sent and the registry observing it, which varies by less on a
// healthy control plane.
const SessionRenewalGrace = 500 * time.Millisecond

// RenewalDueAt is the instant by which the registry expects to have seen
// the session's next version: ObservedAt, plus the interval the client
// renews at (a third of Duration, or the longer Period it was seen to
// renew at), plus SessionRenewalGrace.
func (s Session) RenewalDueAt() time.Time {
	return s.ObservedAt.Add(max(s.Duration/SessionRenewalsPerDuration, s.Period) + SessionRenewalGrace)
}

// CheckSessionRenewing reports whether a session that keeps a request
// alive (CheckSession passes) is still being renewed at now. It is for the
// one decision that must not wait for the session to lapse, because a dead
// client would make every request behind it wait: whether to grant the
// head of a queue (a grant, once made, ends only when its session lapses;
// see SessionLapse). A client that renews on its cadence passes it; one
// that missed its renewal by SessionRenewalGrace is counted gone a few
// seconds before its session lapses. It returns nil, or an *Error with
// ReasonSessionExpired when now is at or after RenewalDueAt.
func CheckSessionRenewing(s *Session, now time.Time) error {
	if s == nil {
		return refuse(ReasonSessionExpired, "the session Lease does not exist")
	}
	if due := s.RenewalDueAt(); Expired(due, now) {
		return refuse(ReasonSessionExpired, "the session Lease missed its renewal due at %s: no renewal seen for %s, where its client renews every %s",
			due.UTC().Format(time.RFC3339Nano), now.Sub(s.ObservedAt).Round(time.Millisecond), max(s.Duration/SessionRenewalsPerDuration, s.Period).Round(time.Millisecond))
	}
	return nil
}

// LapsesAt is the instant from which the session is lapsed unless a newer
// version is observed: ObservedAt + SessionLapse(Duration).
func (s Session) LapsesAt() time.Time { return s.ObservedAt.Add(SessionLapse(s.Duration)) }

// SessionLapse is how long after the registry observes a version of a
// session of duration d it counts the session lapsed, unless it observes a
// newer one: d + SessionMargin. A client bounds from it when the registry
// may end its grants: no earlier than SessionLapse(d) after it sent the
// renewal that made that version, by the registry's clock.
func SessionLapse(d time.Duration) time.Duration { return d + SessionMargin }

// CheckSession reports whether the session a request names keeps it alive
// at now: s is the session as the registry knows it (nil when the Lease
// does not exist), uid the Lease UID the request names and owner the
// request's owner. It returns nil, or an *Error with ReasonSessionExpired
// when the Lease is gone or replaced by another UID, when it does not name
// the owner as its holder, or when it lapsed (now at or after LapsesAt).
func CheckSession(s *Session, uid, owner string, now time.Time) error {
	switch {
	case s == nil:
		return refuse(ReasonSessionExpired, "the session Lease does not exist")
	case s.UID != uid:
		return refuse(ReasonSessionExpired, "the session Lease was replaced (uid %s, the request names %s)", s.UID, uid)
	case s.Holder != owner:
		return refuse(ReasonSessionExpired, "the session Lease is held by %q, not by the owner %q", s.Holder, owner)
	case Expired(s.LapsesAt(), now):
		return refuse(ReasonSessionExpired, "the session Lease lapsed at %s: no renewal seen for %s", s.LapsesAt().UTC().Format(time.RFC3339Nano), SessionLapse(s.Duration))
	}
	return nil
}
