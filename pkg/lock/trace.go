package lock

import (
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// TraceKind says what a TraceEvent reports.
type TraceKind string

const (
	// TraceState means the holder state changed (Previous to State), as the
	// handle published it: REQUESTED to HELD when the grant is confirmed,
	// HELD to OWNERSHIP_UNKNOWN at the local deadline, to EXPIRED or
	// RELEASED when the acquisition ended, ... A state the handle passed
	// through between two of its steps is not reported.
	TraceState TraceKind = "state"
	// TraceDone means the handle's Context ended; Err says why
	// (ErrOwnershipUnknown, ErrReleased, or ErrLost and the refusal).
	// Reported once, at the instant the handle stopped allowing new
	// effects.
	TraceDone TraceKind = "done"
	// TraceRenewSent means the handle is sending a renew that sets
	// spec.renewals to Renewals. A renew whose outcome was unknown is
	// reported again when it is resent, with the same Renewals.
	TraceRenewSent TraceKind = "renew-sent"
	// TraceRenewAnswered means the API server answered the renew of Renewals,
	// or no answer came (RenewErr). An accepted renew extends the lease
	// only once the controller has observed it: a later TraceState says so.
	TraceRenewAnswered TraceKind = "renew-answered"
)

// TraceEvent is one step of a Handle, as WithTrace reports it: what the
// holder believed about its lock at that instant, and the requests that
// keep it. It is a record for tests, checkers and debugging; the handle's
// decisions never depend on it.
type TraceEvent struct {
	// Kind says what happened.
	Kind TraceKind
	// Time is when it happened, read from the handle's clock (WithClock;
	// the real clock by default).
	Time time.Time
	// Grant is the LockGrant's namespace and name, UID its UID and
	// Resource the resource ID the lock is on.
	Grant    types.NamespacedName
	UID      types.UID
	Resource string
	// State is the holder state after the step. Previous is the state the
	// handle reported before it (for TraceState), or State.
	State, Previous holder.State
	// Fence is the grant's fencing token, 0 until the grant was Held.
	Fence int64
	// Deadline is the local deadline: the instant of the handle's clock
	// until which it allows new effects unless a renew moves it later
	// (the send time of the create or renew the controller confirmed last,
	// plus TTL minus the safety margin). Zero until the first confirmation.
	Deadline time.Time
	// Reason is why the acquisition ended (holder.Machine.Reason: EXPIRED,
	// RELEASED, REVOKED, TIMED_OUT, UNKNOWN_GRANT, or the code of the
	// refusal that ended it), "" while it has not.
	Reason fencing.Reason
	// Err is the cause of the handle's Context at this step
	// (context.Cause): nil while it runs.
	Err error
	// Renewals is the spec.renewals value of the renew a TraceRenewSent or
	// TraceRenewAnswered reports.
	Renewals int64
	// RenewErr is the answer to that renew (TraceRenewAnswered): nil when
	// the API server accepted it; an error matching its fencing sentinel
	// when it was refused (fencing.ErrUnknownGrant when the grant is gone);
	// otherwise no answer came (a lost reply, a timeout, a server error)
	// and the handle reads the grant and resends the renew.
	RenewErr error
}

// WithTrace calls fn with every step of the Handle an Acquire makes (see
// TraceEvent): each holder state change with the fence and the local
// deadline, the end of its Context, and each renew sent and its answer, from
// the create on, also for an acquisition that Acquire gives up on. Steps
// are reported in the order they happened, one at a time, never while the
// handle holds its own lock, so fn may call the Handle's methods (except
// Release, which waits for the renewal loop); fn runs on the goroutine of
// the Handle call or of the renewal loop that made the step, and must
// return quickly: renewals wait for it. A step may be
// reported just after the call that made it returned, when another
// goroutine is still delivering earlier steps. Default: none, and no
// record is kept.
//
// A holder's trace with the times its requests were sent tells a checker
// what the holder believed and when: that it held the lock from a HELD
// state until its Context ended, and that it stopped at the local deadline or when the
// registry said its grant had ended.
func WithTrace(fn func(TraceEvent)) Option {
	return func(s *settings) {
		if fn == nil {
			s.fail("nil trace function")
		}
		s.trace = fn
	}
}

// traceStep queues one step for the trace, filled in with the handle's
// current state; h.mu held. Nothing happens without a trace.
func (h *Handle) traceStep(e TraceEvent) {
	if h.trace == nil {
		return
	}
	e.Time = h.clk.Now()
	e.Grant, e.UID, e.Resource = h.key, h.uid, h.resource
	e.State = h.m.State()
	if e.Kind != TraceState {
		e.Previous = e.State
	}
	e.Fence, e.Reason, e.Err = h.m.Fence(), h.m.Reason(), h.cause
	if d, ok := h.m.Deadline(); ok {
		e.Deadline = h.origin.Add(time.Duration(d))
	}
	h.traceQ = append(h.traceQ, e)
}

// traceRenewAnswer queues the answer to a renew; h.mu held.
func (h *Handle) traceRenewAnswer(r renewResult) {
	err := r.err
	if errors.Is(err, errGone) {
		err = gone(h.key, h.uid, err)
	}
	h.traceStep(TraceEvent{Kind: TraceRenewAnswered, Renewals: r.target, RenewErr: err})
}

// flushTrace delivers the queued steps, in order, unless another goroutine
// is delivering (it then delivers these too). Call it without h.mu.
func (h *Handle) flushTrace() {
	if h.trace == nil {
		return
	}
	h.mu.Lock()
	if h.tracing {
		h.mu.Unlock()
		return
	}
	h.tracing = true
	for len(h.traceQ) > 0 {
		q := h.traceQ
		h.traceQ = nil
		h.mu.Unlock()
		for _, e := range q {
			h.trace(e)
		}
		h.mu.Lock()
	}
	h.tracing = false
	h.mu.Unlock()
}
