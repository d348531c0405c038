package lock

import (
	"math/rand/v2"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// renewLoop drives a schedule as the handle's loop does, on a fake clock:
// a 30 s lease (margin 3 s, a renew due 10 s after each confirmed send)
// created at the clock's origin and read Held with fence 1.
type renewLoop struct {
	t      *testing.T
	clk    *clocktesting.FakeClock
	origin time.Time
	m      *holder.Machine
	s      schedule
}

func newRenewLoop(t *testing.T) *renewLoop {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	m, err := holder.New(holder.Config{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := &renewLoop{t: t, clk: clk, origin: clk.Now(), m: m}
	m.Created(l.now())
	l.observe(0)
	if st := m.State(); st != holder.Held {
		t.Fatalf("state %s after the grant was read Held, want HELD", st)
	}
	return l
}

func (l *renewLoop) now() holder.Mono { return holder.Mono(l.clk.Since(l.origin)) }

// next ticks the machine and takes the schedule's step, as Handle.due does
// for a handle that may renew.
func (l *renewLoop) next() step {
	now := l.now()
	l.m.Tick(now)
	return l.s.next(now, l.m, true)
}

// observe applies a read of the grant Held with observedRenewals observed.
func (l *renewLoop) observe(observed int64) {
	l.m.Observe(l.now(), holder.Facts{Phase: lockingv1alpha1.PhaseHeld, Fence: 1, Renewals: observed, ObservedRenewals: observed})
}

// sleep waits on the fake clock for the step's timer, as the loop does:
// the timer must not fire before the step's wake, and fires when the clock
// reaches it.
func (l *renewLoop) sleep(st step) {
	l.t.Helper()
	if !st.wake.set {
		l.t.Fatal("the step has no wake: the loop would sleep until a read arrives")
	}
	c, stop := st.timer(l.clk, l.now())
	defer stop()
	if d := time.Duration(st.wake.at - l.now()); d > time.Millisecond {
		l.clk.Step(d - time.Millisecond)
		select {
		case <-c:
			l.t.Fatalf("the timer fired at %s, before the wake at %s", l.now(), st.wake.at)
		default:
		}
	}
	l.clk.SetTime(l.origin.Add(time.Duration(st.wake.at)))
	select {
	case <-c:
	default:
		l.t.Fatalf("the timer did not fire at its wake %s", st.wake.at)
	}
}

func sec(s float64) holder.Mono { return holder.Mono(s * float64(time.Second)) }

// A held lock renews a third of the TTL after each confirmed send, one
// renew at a time, and reads the grant when the watch does not confirm an
// accepted renew within confirmWait.
func TestScheduleRenewsOnTime(t *testing.T) {
	l := newRenewLoop(t)
	st := l.next()
	if st.renew != 0 || st.read || st.wake.at != sec(10) {
		t.Fatalf("just held: %+v; want nothing to send, wake at the renew due at +10s", st)
	}
	l.sleep(st)
	if st = l.next(); st.renew != 1 || st.wake.at != sec(27) {
		t.Fatalf("at +10s: %+v; want renew 1 sent, wake at the deadline +27s while it is in flight", st)
	}
	if again := l.next(); again.renew != 0 {
		t.Fatalf("a second step while the renew is in flight sent renew %d", again.renew)
	}
	l.clk.Step(200 * time.Millisecond)
	l.s.accepted(l.now(), true)
	if st = l.next(); st.read || st.wake.at != sec(11.2) {
		t.Fatalf("accepted, not confirmed: %+v; want a read due confirmWait later, at +11.2s", st)
	}
	l.sleep(st)
	if st = l.next(); !st.read || st.renew != 0 {
		t.Fatalf("at +11.2s: %+v; want the grant read", st)
	}
	l.observe(1) // the renew sent at +10s is confirmed: deadline +37s
	if st = l.next(); st.renew != 0 || st.read || st.wake.at != sec(20) {
		t.Fatalf("confirmed: %+v; want the next renew due at +20s", st)
	}
	l.sleep(st)
	if st = l.next(); st.renew != 2 {
		t.Fatalf("at +20s: %+v; want renew 2", st)
	}
}

// A renew whose outcome is unknown is sent again with the same renewals
// value after retryWait, after a read; a refusal that does not end the
// grant is sent again too; a read that shows it landed stops the resend.
func TestScheduleResendsTheSameRenew(t *testing.T) {
	l := newRenewLoop(t)
	l.sleep(l.next())
	if st := l.next(); st.renew != 1 {
		t.Fatalf("at +10s: renew %d, want 1", st.renew)
	}
	l.s.unknown(l.now())
	st := l.next()
	if !st.read || st.renew != 0 || st.wake.at != sec(10.5) {
		t.Fatalf("outcome unknown: %+v; want a read now and a resend at +10.5s", st)
	}
	l.sleep(st)
	if st = l.next(); st.renew != 1 {
		t.Fatalf("at +10.5s: renew %d, want the same renew 1 again", st.renew)
	}
	l.s.refused(l.now())
	l.m.Refused(l.now(), fencing.ReasonNotHeld)
	if st = l.next(); st.renew != 0 || st.wake.at != sec(11) {
		t.Fatalf("refused NOT_HELD: %+v; want a resend at +11s", st)
	}
	l.sleep(st)
	if st = l.next(); st.renew != 1 {
		t.Fatalf("at +11s: renew %d, want renew 1 again", st.renew)
	}
	l.s.unknown(l.now())
	l.observe(1) // the read shows the renew landed
	if st = l.next(); st.renew != 0 || st.wake.at != sec(20) {
		t.Fatalf("settled by a read: %+v; want no resend, the next renew at +20s", st)
	}
}

// Once the local deadline has passed, nothing is sent that could extend
// the lock the holder was told it lost: not even the resend of a renew
// whose outcome is unknown that falls due at that very instant.
func TestScheduleSendsNoRenewPastTheDeadline(t *testing.T) {
	l := newRenewLoop(t)
	l.sleep(l.next())
	if st := l.next(); st.renew != 1 {
		t.Fatalf("at +10s: renew %d, want 1", st.renew)
	}
	// Every attempt's outcome stays unknown; the resends come every
	// retryWait, the last one due exactly at the deadline (+27s).
	for l.now() < sec(27) {
		l.s.unknown(l.now())
		st := l.next()
		if st.wake.at > sec(27) {
			t.Fatalf("at %s the loop sleeps until %s, past the deadline +27s", l.now(), st.wake.at)
		}
		l.sleep(st)
		st = l.next()
		if l.now() >= sec(27) {
			if st.renew != 0 {
				t.Fatalf("at the deadline %s: renew %d sent in state %s", l.now(), st.renew, l.m.State())
			}
			break
		}
		if st.renew != 1 {
			t.Fatalf("at %s: renew %d, want the resend of renew 1", l.now(), st.renew)
		}
	}
	if st := l.m.State(); st != holder.OwnershipUnknown {
		t.Fatalf("state %s at the deadline, want OWNERSHIP_UNKNOWN", st)
	}
	l.clk.Step(time.Minute)
	if st := l.next(); st.renew != 0 {
		t.Fatalf("a minute past the deadline: renew %d sent", st.renew)
	}
}

// Whatever the answers and reads, and whenever they come, a held lock's
// loop never sleeps past the local deadline, and no renew leaves after it:
// the handle's context ends no later than the deadline, and a renew never
// extends a lost lock.
func TestScheduleNeverSchedulesPastTheDeadline(t *testing.T) {
	for seed := range uint64(200) {
		rnd := rand.New(rand.NewPCG(seed, 27))
		l := newRenewLoop(t)
		var sent, observed int64
		for range 200 {
			now := l.now()
			l.m.Tick(now)
			d, _ := l.m.Deadline()
			st := l.s.next(now, l.m, true)
			state := l.m.State()
			if st.renew != 0 {
				if now >= d {
					t.Fatalf("seed %d: renew %d sent at %s, at or past the deadline %s", seed, st.renew, now, d)
				}
				sent = st.renew
			}
			if state == holder.Held || state == holder.Renewing {
				if !st.wake.set || st.wake.at > d {
					t.Fatalf("seed %d: held at %s, the loop sleeps until %+v, past the deadline %s", seed, now, st.wake, d)
				}
			}
			if state == holder.OwnershipUnknown {
				// A read tells the truth: the last renew landed, or not.
				if rnd.IntN(2) == 0 {
					observed = sent
				}
				l.observe(observed)
				if l.m.Tick(l.now()) == holder.OwnershipUnknown {
					return // the lock is lost for good: nothing more is sent (checked above)
				}
				continue
			}
			// What arrives before the wake, if anything.
			wait := time.Duration(st.wake.at - now)
			if wait < 0 {
				wait = 0
			}
			switch r := rnd.IntN(6); {
			case r == 0 && l.s.inFlight:
				l.clk.Step(time.Duration(rnd.Int64N(int64(wait) + 1)))
				l.s.accepted(l.now(), rnd.IntN(2) == 0)
			case r == 1 && l.s.inFlight:
				l.clk.Step(time.Duration(rnd.Int64N(int64(wait) + 1)))
				l.s.unknown(l.now())
			case r == 2 && l.s.inFlight:
				l.clk.Step(time.Duration(rnd.Int64N(int64(wait) + 1)))
				l.s.refused(l.now())
				l.m.Refused(l.now(), fencing.ReasonNotHeld)
			case r == 3 && sent > observed:
				l.clk.Step(time.Duration(rnd.Int64N(int64(wait) + 1)))
				observed = sent
				l.observe(observed)
			default:
				l.sleep(st)
			}
		}
	}
}
