package holder

import (
	"errors"
	"fmt"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Mono is an instant of one process's monotonic clock: the time elapsed
// since an origin the caller fixed once (for example time.Since(start) for a
// start taken at process start). Only differences between Monos of the same
// clock mean anything. A Mono is never a wall-clock reading and never comes
// from the registry.
type Mono time.Duration

// String formats m as a duration since the origin, e.g. "+2.5s".
func (m Mono) String() string { return "+" + time.Duration(m).String() }

// State is the holder's belief about its ownership.
type State int

const (
	// Requested means the acquire was sent; validity is not confirmed yet.
	Requested State = iota + 1
	// Held means the grant is the holder's until the local deadline.
	Held
	// Renewing means Held, with a renew sent whose effect is not observed yet.
	Renewing
	// OwnershipUnknown means the local deadline passed without proof that the
	// lease was extended. No new effects; reconcile by reading the grant.
	OwnershipUnknown
	// Expired means the registry says this acquisition does not hold: the lease
	// or the wait limit ran out, the grant was revoked or deleted, or a
	// renew or release was refused. Final.
	Expired
	// Released means the registry ended the acquisition by a release (this
	// holder's, or a withdrawal before it was granted). Final.
	Released
)

// String returns the state's name as the design documents write it:
// REQUESTED, HELD, RENEWING, OWNERSHIP_UNKNOWN, EXPIRED or RELEASED.
func (s State) String() string {
	switch s {
	case Requested:
		return "REQUESTED"
	case Held:
		return "HELD"
	case Renewing:
		return "RENEWING"
	case OwnershipUnknown:
		return "OWNERSHIP_UNKNOWN"
	case Expired:
		return "EXPIRED"
	case Released:
		return "RELEASED"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Final reports whether s can never change again.
func (s State) Final() bool { return s == Expired || s == Released }

// A machine's reasons for being Expired or Released are codes of the
// fencing catalog: fencing.ReasonReleased, fencing.ReasonTimedOut,
// fencing.ReasonRevoked, fencing.ReasonExpired, fencing.ReasonUnknownGrant
// (the grant no longer exists, or its name now belongs to another
// acquisition: an administrator's forced release), and the code of any
// refusal that ended it (fencing.ReasonNotOwner,
// fencing.ReasonDriverMismatch, ...).

// Config is a machine's lease parameters.
type Config struct {
	// TTL is the grant's lease duration (spec.leaseDurationSeconds). Required.
	TTL time.Duration
	// Margin is subtracted from every deadline to absorb clock-rate
	// differences. 0 means DefaultMargin(TTL). Must be less than TTL.
	Margin time.Duration
	// RenewInterval is how long after a confirmed send the next renew is
	// due. 0 means DefaultRenewInterval(TTL). Must be positive and less than
	// TTL - Margin, so that a renew is sent while the grant is still valid.
	RenewInterval time.Duration
}

// DefaultMargin is the default safety margin for a lease of ttl: a tenth of
// it, at least one second, but never more than half the lease.
// TTL 1 s: 0.5 s; 10 s: 1 s; 30 s: 3 s; 60 s: 6 s.
func DefaultMargin(ttl time.Duration) time.Duration {
	m := max(ttl/10, time.Second)
	return min(m, ttl/2)
}

// DefaultRenewInterval is the default time from one confirmed send to the
// next renew: a third of the lease, which leaves about two more tries before
// the local deadline. An operational choice, not a correctness condition.
func DefaultRenewInterval(ttl time.Duration) time.Duration { return ttl / 3 }

// ErrInvalidConfig is returned by New for an unusable Config.
var ErrInvalidConfig = errors.New("holder: invalid config")

func (c Config) withDefaults() (Config, error) {
	if c.TTL <= 0 {
		return c, fmt.Errorf("%w: TTL %s is not positive", ErrInvalidConfig, c.TTL)
	}
	if c.Margin == 0 {
		c.Margin = DefaultMargin(c.TTL)
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = DefaultRenewInterval(c.TTL)
	}
	if c.Margin < 0 || c.Margin >= c.TTL {
		return c, fmt.Errorf("%w: margin %s must be in [0, TTL %s)", ErrInvalidConfig, c.Margin, c.TTL)
	}
	if c.RenewInterval <= 0 || c.RenewInterval >= c.TTL-c.Margin {
		return c, fmt.Errorf("%w: renew interval %s must be in (0, TTL-margin %s)", ErrInvalidConfig, c.RenewInterval, c.TTL-c.Margin)
	}
	return c, nil
}

// Facts is what one read (a GET, a watch event, or the response of a
// write) says about the grant. It holds no registry times: the holder cannot
// compare them with its own clock.
type Facts struct {
	// Phase is status.phase ("" before the controller answered).
	Phase lockingv1alpha1.LockGrantPhase
	// Fence is status.fenceToken.
	Fence int64
	// Renewals is spec.renewals.
	Renewals int64
	// ObservedRenewals is status.observedRenewals.
	ObservedRenewals int64
	// Gone means the grant does not exist any more, or its name belongs to
	// another acquisition (another UID).
	Gone bool
}

// FactsOf returns the facts of a LockGrant as read; Gone when g is nil.
func FactsOf(g *lockingv1alpha1.LockGrant) Facts {
	if g == nil {
		return Facts{Gone: true}
	}
	return Facts{
		Phase:            g.Status.Phase,
		Fence:            g.Status.FenceToken,
		Renewals:         g.Spec.Renewals,
		ObservedRenewals: g.Status.ObservedRenewals,
	}
}

// renew is a renew whose effect the machine has not observed yet.
type renew struct {
	// target is the spec.renewals value it sets.
	target int64
	// sentAt is when the first attempt for target was sent; retries keep it.
	sentAt Mono
}

// Machine is one acquisition's holder state. It is not safe for concurrent
// use; the caller serializes calls. Every method that takes now expects
// instants that never go backwards.
type Machine struct {
	cfg   Config
	state State
	// reason says why the machine is final.
	reason fencing.Reason
	fence  int64
	// granted: the registry has reported the grant Held at least once.
	granted bool
	// lower is the send time of the create whose success created the grant.
	lower    Mono
	hasLower bool
	// base is the send time of the request whose effect the registry
	// confirmed last; the deadline is base + TTL - margin.
	base    Mono
	hasBase bool
	// confirmed: base is the send time of a renew the registry confirmed.
	confirmed bool
	pending   *renew
	// known is the highest spec.renewals value read or sent.
	known     int64
	releasing bool
}

// New returns a machine in state Requested: the caller is about to send, or
// has sent, the acquire.
func New(cfg Config) (*Machine, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Machine{cfg: cfg, state: Requested}, nil
}

// Config returns the machine's configuration, defaults filled in.
func (m *Machine) Config() Config { return m.cfg }

// State returns the current state. It does not advance time: call Tick first.
func (m *Machine) State() State { return m.state }

// Reason says why a final machine ended, as a code of the fencing catalog
// (RELEASED, TIMED_OUT, EXPIRED, REVOKED, UNKNOWN_GRANT, NOT_OWNER, ...);
// "" while not final.
func (m *Machine) Reason() fencing.Reason { return m.reason }

// Fence returns the grant's fencing token, 0 until the registry reported it.
func (m *Machine) Fence() int64 { return m.fence }

// Deadline returns the local validity deadline, and false when no request's
// effect has been confirmed yet.
func (m *Machine) Deadline() (Mono, bool) {
	if !m.hasBase {
		return 0, false
	}
	return m.base + Mono(m.cfg.TTL-m.cfg.Margin), true
}

// Valid reports whether the holder may start a new effect at now: Held or
// Renewing, before the deadline, and no release sent. It does not change the
// state; Tick does.
func (m *Machine) Valid(now Mono) bool {
	if m.releasing || (m.state != Held && m.state != Renewing) {
		return false
	}
	d, ok := m.Deadline()
	return ok && now < d
}

// Releasing reports whether a release has been sent.
func (m *Machine) Releasing() bool { return m.releasing }

// PendingRenew returns the renewals value of the renew sent and not yet
// observed, with its first send time.
func (m *Machine) PendingRenew() (target int64, sentAt Mono, ok bool) {
	if m.pending == nil {
		return 0, 0, false
	}
	return m.pending.target, m.pending.sentAt, true
}

// Created records that the create sent at sentAt succeeded: the grant was
// made by that request, so the registry granted it after sentAt. Call it only
// for a create whose own response was a success; a grant found by its request
// ID (AlreadyExists) may be older than any send this machine knows of, and
// its validity is then established by a renew (see NextRenew). A grant
// reported Held RenewInterval or more after sentAt (it waited in the queue)
// is established by a renew too: see Observe.
func (m *Machine) Created(sentAt Mono) {
	if m.state == Requested {
		m.lower, m.hasLower = sentAt, true
	}
}

// Tick advances the machine to now: Held or Renewing past the deadline
// becomes OwnershipUnknown. It returns the state.
func (m *Machine) Tick(now Mono) State {
	m.settle(now)
	return m.state
}

// NextRenew returns when the next renew is due, and false when none is:
// final, releasing, OwnershipUnknown (read first), a renew already pending
// (the caller decides when to retry it, with RenewSent again), or still
// waiting in the queue. A grant reported Held that is not Held yet (found
// by request ID, or granted RenewInterval or more after its create was
// sent) is due at once.
func (m *Machine) NextRenew(now Mono) (Mono, bool) {
	if m.state.Final() || m.releasing || m.pending != nil {
		return 0, false
	}
	switch m.state {
	case Held:
		return m.base + Mono(m.cfg.RenewInterval), true
	case Requested:
		if m.granted {
			return now, true
		}
	}
	return 0, false
}

// RenewSent records that a renew was sent at now and returns the
// spec.renewals value it must set. While an earlier renew is pending, it
// returns that renew's target and keeps its first send time: a retry of an
// attempt whose outcome is unknown must not claim a later start. It returns
// false when a renew makes no sense: final, releasing, or not granted yet.
func (m *Machine) RenewSent(now Mono) (int64, bool) {
	if m.state.Final() || m.releasing || !m.granted {
		return 0, false
	}
	if m.pending == nil {
		m.pending = &renew{target: m.known + 1, sentAt: now}
		m.known = m.pending.target
	}
	if m.state == Held {
		m.state = Renewing
	}
	m.settle(now)
	return m.pending.target, true
}

// Observe applies one read of the grant at now and returns the new state.
// A Held grant whose observedRenewals reached the pending renew's target
// moves the deadline to that renew's send time + TTL - margin; a read is
// the only way out of OwnershipUnknown.
//
// A grant reported Held RenewInterval or more after its create was sent
// (it waited in the queue, or the answer was slow) stays Requested, with a
// renew due at once (NextRenew), and becomes Held when that renew's
// confirmation is observed, its deadline counted from the renew's send
// time. However long it waited, a grant thus starts Held with at least
// TTL - margin - max(RenewInterval, its first renew's round trip) of
// validity, and a slow first renew does not make the holder give up a
// grant the registry holds for it: the registry's lease runs a full TTL
// from the grant, and from the renew.
func (m *Machine) Observe(now Mono, f Facts) State {
	if m.state.Final() {
		return m.state
	}
	switch {
	case f.Gone:
		if m.releasing {
			m.end(Released, fencing.ReasonReleased)
		} else {
			m.end(Expired, fencing.ReasonUnknownGrant)
		}
	case f.Phase == lockingv1alpha1.PhaseReleased:
		m.end(Released, fencing.ReasonReleased)
	case f.Phase == lockingv1alpha1.PhaseExpired:
		m.end(Expired, fencing.ReasonExpired)
	case f.Phase == lockingv1alpha1.PhaseTimedOut:
		m.end(Expired, fencing.ReasonTimedOut)
	case f.Phase == lockingv1alpha1.PhaseRevoked:
		m.end(Expired, fencing.ReasonRevoked)
	case f.Phase == lockingv1alpha1.PhaseHeld:
		if m.fence == 0 {
			m.fence = f.Fence
		}
		m.granted = true
		m.known = max(m.known, f.Renewals)
		if m.pending != nil && f.ObservedRenewals >= m.pending.target {
			m.setBase(m.pending.sentAt)
			m.pending, m.confirmed = nil, true
		}
		if !m.hasBase && m.hasLower {
			m.setBase(m.lower)
		}
		m.settle(now)
	}
	return m.state
}

// Refused applies a definite refusal of this holder's renew or release, by
// its reason code, and returns the new state. A code that does not end the
// grant (fencing.EndsGrant false: NOT_HELD, still queued; INTERNAL, nothing
// decided) changes nothing; ALREADY_ENDED and RELEASED end the machine as
// Released; every other refusal (EXPIRED, NOT_OWNER, REVOKED, STALE_OWNER,
// UNKNOWN_GRANT, DRIVER_MISMATCH, an unknown code, ...) ends it as Expired
// with that reason: the registry will not extend this lease, so the holder
// fails closed. A refusal is the registry's judgement, not an assumption.
func (m *Machine) Refused(now Mono, r fencing.Reason) State {
	if m.state.Final() {
		return m.state
	}
	switch {
	case !fencing.EndsGrant(r):
		m.settle(now)
	case r == fencing.ReasonAlreadyEnded || r == fencing.ReasonReleased:
		m.end(Released, r)
	default:
		m.end(Expired, r)
	}
	return m.state
}

// ReleaseSent records that a release was sent: from now on the holder is
// not Valid, whatever the answer.
func (m *Machine) ReleaseSent(Mono) { m.releasing = true }

// ReleaseAccepted records that the registry accepted the release: Released.
func (m *Machine) ReleaseAccepted(Mono) State {
	if !m.state.Final() {
		m.end(Released, fencing.ReasonReleased)
	}
	return m.state
}

func (m *Machine) setBase(b Mono) {
	if !m.hasBase || b > m.base {
		m.base, m.hasBase = b, true
	}
}

func (m *Machine) end(s State, reason fencing.Reason) {
	m.state, m.reason = s, reason
	m.pending = nil
}

// settle derives the non-final state from the deadline and the pending renew.
func (m *Machine) settle(now Mono) {
	if m.state.Final() {
		return
	}
	d, ok := m.Deadline()
	live := ok && now < d
	held := Held
	if m.pending != nil {
		held = Renewing
	}
	switch m.state {
	case Requested:
		// A grant becomes Held from its create's send time only while
		// that is less than RenewInterval ago, so that it starts with
		// at least the validity a holder has whenever its next renew is
		// due (TTL - margin - RenewInterval); a later one is confirmed
		// by a renew first, instead of starting with a deadline about to
		// pass, and is Held from that renew's send time.
		if live && (m.confirmed || now < m.base+Mono(m.cfg.RenewInterval)) {
			m.state = held
		}
	case Held, Renewing:
		if live {
			m.state = held
		} else {
			m.state = OwnershipUnknown
		}
	case OwnershipUnknown:
		if live {
			m.state = held
		}
	}
}
