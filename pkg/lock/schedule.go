package lock

import (
	"time"

	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// Timing of the renew loop, on the handle's clock.
const (
	// confirmWait is how long after an accepted renew the handle waits for
	// the watch to show the controller's answer before reading the grant.
	confirmWait = time.Second
	// retryWait is the pause before resending a renew whose outcome is
	// unknown, or that was refused without ending the grant.
	retryWait = 500 * time.Millisecond
)

// schedule is when a handle's loop sends renews and reads its grant, on
// the handle's monotonic clock. The holder machine says when a renew is
// due and where the local deadline lies; the schedule adds what the
// machine leaves to its caller: one renew request in flight at a time, a
// resend retryWait after an answer that settled nothing, a read
// confirmWait after an accepted renew the watch has not confirmed yet, and
// the instant the loop must wake up next.
//
// It never sends a renew once the local deadline has passed
// (OWNERSHIP_UNKNOWN): a renew never extends a lock the holder was told
// it lost. And it never sleeps past the local deadline while the grant is
// HELD or RENEWING, so that the loop ticks the machine, and the handle's
// context ends, at that deadline.
//
// A schedule is not safe for concurrent use; the handle's mu guards it.
type schedule struct {
	// inFlight: a renew request was sent and its answer has not come back.
	inFlight bool
	// retry is when the pending renew is sent again; read is when the
	// grant is read to learn its fate.
	retry, read instant
}

// instant is an instant of the monotonic clock, when set.
type instant struct {
	at  holder.Mono
	set bool
}

// due reports whether i is set and has come at now.
func (i instant) due(now holder.Mono) bool { return i.set && i.at <= now }

// after returns the instant d after now.
func after(now holder.Mono, d time.Duration) instant {
	return instant{at: now + holder.Mono(d), set: true}
}

// step is what the loop does at one instant: the requests to send now, and
// when to come back.
type step struct {
	// renew is the spec.renewals value of the renew to send now; 0: none.
	renew int64
	// read: read the grant now.
	read bool
	// wake is when the loop must look again (unset: only when something
	// arrives).
	wake instant
}

// wakeBy moves the step's wake up to i, if i is set and earlier.
func (s *step) wakeBy(i instant) {
	if i.set && (!s.wake.set || i.at < s.wake.at) {
		s.wake = i
	}
}

// next decides what is due at now for the acquisition whose machine m has
// been ticked to now. renewable says whether the handle may renew at all:
// not spent, and its status says Held (admission judges a renew on the
// status). A renew it returns is recorded on m as sent (m.RenewSent).
func (s *schedule) next(now holder.Mono, m *holder.Machine, renewable bool) step {
	var out step
	if _, _, pending := m.PendingRenew(); !pending {
		s.retry = instant{} // settled by a read meanwhile
	}
	st := m.State()
	// Past the local deadline the holder has been told it lost the lock;
	// nothing it sends then may extend it.
	renewable = renewable && st != holder.OwnershipUnknown && !st.Final()
	if renewable && !s.inFlight {
		renewAt, due := m.NextRenew(now)
		if (due && renewAt <= now) || s.retry.due(now) {
			out.renew, s.inFlight = m.RenewSent(now)
			s.retry = instant{}
		}
	}
	if s.read.due(now) {
		out.read, s.read = true, instant{}
	}
	if renewable && !s.inFlight {
		if renewAt, ok := m.NextRenew(now); ok {
			out.wakeBy(instant{at: renewAt, set: true})
		}
		out.wakeBy(s.retry)
	}
	out.wakeBy(s.read)
	if d, ok := m.Deadline(); ok && (st == holder.Held || st == holder.Renewing) {
		out.wakeBy(instant{at: d, set: true})
	}
	return out
}

// accepted records that the API server accepted the renew in flight. When
// the answer did not show the controller's confirmation yet (unconfirmed),
// the grant is read confirmWait later, unless the watch shows it first.
func (s *schedule) accepted(now holder.Mono, unconfirmed bool) {
	s.inFlight = false
	if unconfirmed {
		s.read = after(now, confirmWait)
	}
}

// refused records a definite refusal of the renew in flight. One that did
// not end the grant (NOT_HELD, INTERNAL) is sent again retryWait later.
func (s *schedule) refused(now holder.Mono) {
	s.inFlight = false
	s.retry = after(now, retryWait)
}

// unknown records that no answer came for the renew in flight (a lost
// reply, a timeout, a conflict, a server error): the grant is read now to
// learn the truth, and the same renew is sent again retryWait later unless
// the read settles it first.
func (s *schedule) unknown(now holder.Mono) {
	s.inFlight = false
	s.read = instant{at: now, set: true}
	s.retry = after(now, retryWait)
}

// gone records that the grant of the renew in flight no longer exists.
func (s *schedule) gone() { s.inFlight = false }

// timer returns a channel that receives when clk reaches the step's wake,
// with now the instant the step was decided at, and a function that stops
// the timer: a nil channel when the step has no wake, and a closed one when
// the wake has come already.
func (s step) timer(clk clock.WithTicker, now holder.Mono) (<-chan time.Time, func()) {
	switch {
	case !s.wake.set:
		return nil, func() {}
	case s.wake.at <= now:
		c := make(chan time.Time)
		close(c)
		return c, func() {}
	}
	t := clk.NewTimer(time.Duration(s.wake.at - now))
	return t.C(), func() { t.Stop() }
}
