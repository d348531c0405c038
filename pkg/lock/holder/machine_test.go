package holder_test

import (
	"errors"
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// sec is a monotonic instant s seconds after the origin.
func sec(s float64) holder.Mono { return holder.Mono(time.Duration(s * float64(time.Second))) }

// op is one input to the machine at a monotonic instant.
type op struct {
	name string
	do   func(m *holder.Machine, now holder.Mono) holder.State
}

func created(sentAt float64) op {
	return op{"created", func(m *holder.Machine, now holder.Mono) holder.State { m.Created(sec(sentAt)); return m.Tick(now) }}
}

// held observes a Held grant with fence 1, spec.renewals r and
// status.observedRenewals o.
func held(r, o int64) op {
	return op{"observe Held", func(m *holder.Machine, now holder.Mono) holder.State {
		return m.Observe(now, holder.Facts{Phase: lockingv1alpha1.PhaseHeld, Fence: 1, Renewals: r, ObservedRenewals: o})
	}}
}

func phase(p lockingv1alpha1.LockGrantPhase) op {
	return op{"observe " + string(p), func(m *holder.Machine, now holder.Mono) holder.State {
		return m.Observe(now, holder.Facts{Phase: p})
	}}
}

var (
	tick  = op{"tick", func(m *holder.Machine, now holder.Mono) holder.State { return m.Tick(now) }}
	gone  = op{"gone", func(m *holder.Machine, now holder.Mono) holder.State { return m.Observe(now, holder.Facts{Gone: true}) }}
	relSt = op{"release sent", func(m *holder.Machine, now holder.Mono) holder.State { m.ReleaseSent(now); return m.Tick(now) }}
	relOK = op{"release accepted", func(m *holder.Machine, now holder.Mono) holder.State { return m.ReleaseAccepted(now) }}
)

// renewSent sends a renew and checks the target it must carry.
func renewSent(t *testing.T, want int64) op {
	return op{"renew sent", func(m *holder.Machine, now holder.Mono) holder.State {
		got, ok := m.RenewSent(now)
		if !ok || got != want {
			t.Errorf("RenewSent = %d, %v; want target %d", got, ok, want)
		}
		return m.State()
	}}
}

func refused(r fencing.Reason) op {
	return op{"refused " + string(r), func(m *holder.Machine, now holder.Mono) holder.State { return m.Refused(now, r) }}
}

type step struct {
	at   float64
	op   op
	want holder.State
	// deadline, when non-zero, is the expected local deadline in seconds.
	deadline float64
	// valid is checked when set.
	valid *bool
}

var (
	yes = func() *bool { b := true; return &b }()
	no  = func() *bool { b := false; return &b }()
)

// TTL 10 s: margin 1 s, renew every 3.33 s.
func TestMachine(t *testing.T) {
	const (
		R = holder.Requested
		H = holder.Held
		N = holder.Renewing
		U = holder.OwnershipUnknown
		E = holder.Expired
		D = holder.Released
	)
	tests := []struct {
		name  string
		steps func(t *testing.T) []step
		// reason is the final machine's Reason, when set.
		reason fencing.Reason
	}{
		{"granted at once: deadline from the create's send time", func(t *testing.T) []step {
			return []step{
				{0.2, created(0), R, 0, no},
				{0.3, held(0, 0), H, 9, yes},
				{8.999, tick, H, 0, yes},
				{9, tick, U, 0, no}, // equality is past the deadline
			}
		}, ""},
		{"the reply's arrival time is never used", func(t *testing.T) []step {
			// The create's reply took 3 s to arrive: the lease started
			// somewhere in between, so only the send time bounds it.
			return []step{
				{3, created(0), R, 0, no},
				{3, held(0, 0), H, 9, yes},
			}
		}, ""},
		{"granted late in the TTL: a renew first, held from its send time", func(t *testing.T) []step {
			// Granted 8 s into a 10 s TTL after waiting in the queue. The
			// create's send time leaves 1 s: the grant is confirmed by a
			// renew, and a renew answered after that second still counts.
			return []step{
				{0.1, created(0), R, 0, nil},
				{0.2, phase(lockingv1alpha1.PhasePending), R, 0, no},
				{8, held(0, 0), R, 9, no},
				{8, renewSent(t, 1), R, 0, no},
				{9, tick, R, 0, no},
				{9.5, held(1, 0), R, 0, no}, // applied to spec, not yet answered
				{9.6, held(1, 1), H, 17, yes},
			}
		}, ""},
		{"granted just within the renew interval: held at once", func(t *testing.T) []step {
			return []step{
				{0.1, created(0), R, 0, nil},
				{3.3, held(0, 0), H, 9, yes}, // 5.7 s left: more than TTL - margin - TTL/3
				{3.3, renewSent(t, 1), N, 9, yes},
			}
		}, ""},
		{"granted late, with a first renew slower than the renew interval", func(t *testing.T) []step {
			return []step{
				{0.1, created(0), R, 0, nil},
				{5, held(0, 0), R, 9, no},
				{5, renewSent(t, 1), R, 0, no},
				{9.2, held(1, 1), H, 14, yes}, // a 4.2 s round trip: 4.8 s left
				{9.2, renewSent(t, 2), N, 14, yes},
			}
		}, ""},
		{"granted late, then the renew is refused: the lease had run out", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{8, held(0, 0), R, 0, no},
				{8, renewSent(t, 1), R, 0, no},
				{8.1, refused(fencing.ReasonExpired), E, 0, no},
			}
		}, fencing.ReasonExpired},
		{"renew confirmed moves the deadline to its send time", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 9, nil},
				{3.4, renewSent(t, 1), N, 9, yes},
				{3.9, held(1, 0), N, 9, yes}, // spec raised, controller not yet
				{4.5, held(1, 1), H, 12.4, yes},
				{7.8, renewSent(t, 2), N, 12.4, nil},
				{8, held(2, 2), H, 16.8, yes},
			}
		}, ""},
		{"a retried renew keeps the first attempt's send time", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 9, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{5, renewSent(t, 1), N, 0, nil}, // the reply was lost: same target
				{5.1, held(1, 1), H, 12.4, yes},
			}
		}, ""},
		{"renew outcome unknown at the deadline, then a read shows it applied", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 9, nil},
				{8.5, renewSent(t, 1), N, 9, yes},
				{9, tick, U, 0, no},
				{9.5, held(1, 0), U, 0, no}, // applied to spec, not observed
				{10, held(1, 1), H, 17.5, yes},
			}
		}, ""},
		{"renew outcome unknown at the deadline, then a read shows expiry", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{9, tick, U, 0, no},
				{9.5, held(0, 0), U, 0, no}, // a stale read proves nothing
				{11, phase(lockingv1alpha1.PhaseExpired), E, 0, no},
				{11.5, held(1, 1), E, 0, no}, // final stays final
			}
		}, fencing.ReasonExpired},
		{"renew after the lease ran out is refused, never re-acquires", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{9.5, tick, U, 0, no},
				{9.6, renewSent(t, 1), U, 0, no},
				{9.7, refused(fencing.ReasonExpired), E, 0, no},
			}
		}, fencing.ReasonExpired},
		{"a renew by the wrong identity is refused NOT_OWNER", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused(fencing.ReasonNotOwner), E, 0, no},
			}
		}, fencing.ReasonNotOwner},
		{"found by request ID: validity unknown until a renew is observed", func(t *testing.T) []step {
			return []step{
				{1, held(3, 3), R, 0, no}, // no Created: the grant may be old
				{1.1, renewSent(t, 4), R, 0, no},
				{1.3, held(4, 4), H, 10.1, yes},
			}
		}, ""},
		{"granted after a long wait in the queue: renew before HELD", func(t *testing.T) []step {
			return []step{
				{0.1, created(0), R, 0, nil},
				{0.2, phase(lockingv1alpha1.PhasePending), R, 0, no},
				{30, held(0, 0), R, 0, no},
				{30, renewSent(t, 1), R, 0, no},
				{30.2, held(1, 1), H, 39, yes},
			}
		}, ""},
		{"queued, then the wait limit passed", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.2, phase(lockingv1alpha1.PhasePending), R, 0, nil},
				{5, phase(lockingv1alpha1.PhaseTimedOut), E, 0, no},
			}
		}, fencing.ReasonTimedOut},
		{"revoked by the issuer", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{2, phase(lockingv1alpha1.PhaseRevoked), E, 0, no},
			}
		}, fencing.ReasonRevoked},
		{"deleted by an administrator", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{2, gone, E, 0, no},
			}
		}, fencing.ReasonUnknownGrant},
		{"release: no new effects from the send, released on acceptance", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, yes},
				{2, relSt, H, 0, no},
				{2.1, relOK, D, 0, no},
			}
		}, fencing.ReasonReleased},
		{"release whose reply was lost: the read settles it", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{2, relSt, H, 0, no},
				{2.5, phase(lockingv1alpha1.PhaseReleased), D, 0, no},
			}
		}, fencing.ReasonReleased},
		{"released grant deleted before the holder read it", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{2, relSt, H, 0, nil},
				{3, gone, D, 0, no},
			}
		}, fencing.ReasonReleased},
		{"renew refused ALREADY_ENDED: the grant was ended elsewhere", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused(fencing.ReasonAlreadyEnded), D, 0, no},
			}
		}, fencing.ReasonAlreadyEnded},
		{"renew refused REVOKED: the machine ends instead of staying RENEWING", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused(fencing.ReasonRevoked), E, 0, no},
			}
		}, fencing.ReasonRevoked},
		{"renew refused DRIVER_MISMATCH: a second driver stops", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused(fencing.ReasonDriverMismatch), E, 0, no},
			}
		}, fencing.ReasonDriverMismatch},
		{"renew refused NOT_HELD changes nothing", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused(fencing.ReasonNotHeld), N, 0, nil},
			}
		}, ""},
		{"renew refused INTERNAL changes nothing; the deadline still ends it", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused(fencing.ReasonInternal), N, 0, nil},
				{30, tick, U, 0, no},
			}
		}, ""},
		{"renew refused with an unknown code: the holder fails closed", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(0, 0), H, 0, nil},
				{3.4, renewSent(t, 1), N, 0, nil},
				{3.5, refused("SOMETHING_NEW"), E, 0, no},
			}
		}, "SOMETHING_NEW"},
		{"next renew target follows the registry's renewals", func(t *testing.T) []step {
			return []step{
				{0, created(0), R, 0, nil},
				{0.1, held(5, 5), H, 9, nil},
				{3.4, renewSent(t, 6), N, 0, nil},
			}
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := holder.New(holder.Config{TTL: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps(t) {
				got := s.op.do(m, sec(s.at))
				if got != s.want {
					t.Fatalf("step %d (%s at %.3fs): state %s, want %s", i, s.op.name, s.at, got, s.want)
				}
				if s.deadline != 0 {
					if d, ok := m.Deadline(); !ok || d != sec(s.deadline) {
						t.Fatalf("step %d (%s at %.3fs): deadline %s (%v), want %s", i, s.op.name, s.at, d, ok, sec(s.deadline))
					}
				}
				if s.valid != nil && m.Valid(sec(s.at)) != *s.valid {
					t.Fatalf("step %d (%s at %.3fs): Valid = %v, want %v", i, s.op.name, s.at, !*s.valid, *s.valid)
				}
			}
			if tc.reason != "" && m.Reason() != tc.reason {
				t.Fatalf("Reason = %q, want %q", m.Reason(), tc.reason)
			}
		})
	}
}

func TestNextRenew(t *testing.T) {
	m, _ := holder.New(holder.Config{TTL: 9 * time.Second})
	if _, ok := m.NextRenew(0); ok {
		t.Fatal("a renew is due before the grant was reported Held")
	}
	m.Created(sec(1))
	m.Observe(sec(1.5), holder.Facts{Phase: lockingv1alpha1.PhaseHeld, Fence: 4})
	if at, ok := m.NextRenew(sec(1.5)); !ok || at != sec(4) {
		t.Fatalf("NextRenew = %s, %v; want +4s (send time + TTL/3)", at, ok)
	}
	m.RenewSent(sec(4))
	if _, ok := m.NextRenew(sec(4)); ok {
		t.Fatal("a second renew is due while one is pending")
	}
	m.ReleaseSent(sec(5))
	if _, ok := m.RenewSent(sec(5)); ok {
		t.Fatal("RenewSent allowed after the release was sent")
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		ttl, margin time.Duration
	}{
		{time.Second, 500 * time.Millisecond},
		{2 * time.Second, time.Second},
		{10 * time.Second, time.Second},
		{30 * time.Second, 3 * time.Second},
	} {
		if got := holder.DefaultMargin(tc.ttl); got != tc.margin {
			t.Errorf("DefaultMargin(%s) = %s, want %s", tc.ttl, got, tc.margin)
		}
		if _, err := holder.New(holder.Config{TTL: tc.ttl}); err != nil {
			t.Errorf("New with TTL %s and defaults: %v", tc.ttl, err)
		}
	}
	for _, c := range []holder.Config{
		{},
		{TTL: time.Second, Margin: time.Second},
		{TTL: 10 * time.Second, Margin: -time.Second},
		{TTL: 10 * time.Second, RenewInterval: 9 * time.Second},
	} {
		if _, err := holder.New(c); !errors.Is(err, holder.ErrInvalidConfig) {
			t.Errorf("New(%+v) error = %v, want ErrInvalidConfig", c, err)
		}
	}
}
