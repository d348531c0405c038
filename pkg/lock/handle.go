package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// Handle is one acquisition of a lock: one LockGrant, identified by its UID.
// It renews the lease in the background and closes Done the moment the
// holder can no longer prove it holds the lock. All methods are safe for
// concurrent use.
//
// A Handle is spent once Done is closed: Check, Stamp and NextSegment fail
// from then on, even if a later read shows the grant still held. Acquire
// again for a new fence, and Release this one.
type Handle struct {
	c      *Client
	clk    clock.WithTicker
	origin time.Time
	log    logr.Logger

	key       types.NamespacedName
	resource  string
	requestID string
	opRoot    string
	driver    string
	// timeout bounds each request (requestTimeoutFor the TTL).
	timeout time.Duration
	// counter: the handle follows its resource's FenceCounter as well as
	// its grant (followsCounter).
	counter bool

	// Set once the grant exists, then constant.
	uid   types.UID
	owner string
	ttl   time.Duration

	seq atomic.Int64

	mu       sync.Mutex
	m        *holder.Machine
	heldOnce bool
	// permit and fenced are the slot the grant holds and its fenced
	// resource ID, from the first read that shows it Held; constant after.
	permit int32
	fenced string
	// cause is non-nil once Done is closed.
	cause   error
	ctx     context.Context
	cancel  context.CancelCauseFunc
	changed chan struct{}
	last    *lockingv1alpha1.LockGrant
	// lastState is the state changed was last closed for.
	lastState holder.State

	// trace receives the steps traceQ queues (WithTrace); tracing is set
	// while a goroutine delivers them.
	trace   func(TraceEvent)
	traceQ  []TraceEvent
	tracing bool

	releaseMu sync.Mutex
	// finishing: a release whose outcome was unknown is being finished in
	// the background (finishRelease); finished and finishErr: its definite
	// answer. releaseMu held.
	finishing, finished bool
	finishErr           error
	stopOnce            sync.Once
	stop                chan struct{}
	stopped             chan struct{}
}

// observation is one read of the grant: nil when it does not exist.
type observation struct {
	g *lockingv1alpha1.LockGrant
}

// renewResult is the answer to one renew request.
type renewResult struct {
	target int64
	g      *lockingv1alpha1.LockGrant
	err    error
}

// Timing of the renew loop, on the handle's clock.
const (
	// confirmWait is how long after an accepted renew the handle waits for
	// the watch to show the controller's answer before reading the grant.
	confirmWait = time.Second
	// retryWait is the pause before resending a renew whose outcome is unknown.
	retryWait = 500 * time.Millisecond
)

func (h *Handle) mono() holder.Mono { return holder.Mono(h.clk.Since(h.origin)) }

// Fence returns the grant's fencing token (status.fenceToken): strictly
// larger than every token issued before for the resource. Every protected
// write must carry it (see Stamp). 0 before the grant is Held.
func (h *Handle) Fence() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m.Fence()
}

// Grant returns the namespace and name of the LockGrant.
func (h *Handle) Grant() types.NamespacedName { return h.key }

// UID returns the LockGrant's UID, the owner token of this acquisition.
func (h *Handle) UID() types.UID { return h.uid }

// Resource returns the resource ID the lock is on (spec.resource).
func (h *Handle) Resource() string { return h.resource }

// Permit returns the slot the grant holds (status.permit), from 0 to the
// resource's permits minus 1 (see WithPermits): 0 for an exclusive lock,
// and 0 before the grant is Held. It never changes once Held.
func (h *Handle) Permit() int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.permit
}

// FencedResource returns the fenced resource ID of the slot the grant holds
// (status.fencedResource): the ID the fence belongs to, that the signed
// record names, and that guarded objects and store rows written under this
// handle are bound to. It is Resource for an exclusive lock and for slot 0,
// and Resource followed by "#k" for slot k
// (api/v1alpha1.SlotResource). Before the grant is Held it is Resource.
// It never changes once Held.
func (h *Handle) FencedResource() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fencedLocked()
}

// fencedLocked is FencedResource; h.mu held.
func (h *Handle) fencedLocked() string {
	if h.fenced == "" {
		return h.resource
	}
	return h.fenced
}

// RequestID returns the request ID the grant is named after.
func (h *Handle) RequestID() string { return h.requestID }

// DriverToken returns the driver token the grant is bound to (annotation
// locking.lockwarden.io/driver), "" for a detached grant. A process that
// saves it can resume the same attempt after a restart with WithSession
// and the same request ID; keep it as private as a credential.
func (h *Handle) DriverToken() string { return h.driver }

// target is this acquisition, for requests.
func (h *Handle) target() target {
	return target{key: h.key, uid: h.uid, driver: h.driver, timeout: h.timeout}
}

// Owner returns the grant's owner identity (spec.owner), the Kubernetes user
// the client authenticated as.
func (h *Handle) Owner() string { return h.owner }

// TTL returns the lease duration.
func (h *Handle) TTL() time.Duration { return h.ttl }

// OperationRoot returns the grant's operation root (spec.operationRoot).
func (h *Handle) OperationRoot() string { return h.opRoot }

// Record returns the signed grant record (lockGrant.v1, status.record) the
// issuer published when the grant became Held, or nil when the registry
// publishes none. A Handle that learned it holds from the resource's
// FenceCounter (an exclusive lock without a GuardPolicy) may return from
// Acquire a moment before the grant's status arrives: Record is nil, and
// Proof "", until it does. Once set it never changes.
func (h *Handle) Record() *lockingv1alpha1.GrantRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil || h.last.Status.Record == nil {
		return nil
	}
	return h.last.Status.Record.DeepCopy()
}

// AwaitRecord waits until the grant's status has arrived and returns its
// signed record, as Record then does (nil when the registry publishes
// none). A Handle that learned it holds from the resource's FenceCounter
// returns from Acquire before the status; call AwaitRecord before handing
// Proof or Record to anyone who checks them, such as a verifier outside the
// cluster. It returns Err when Done closes first, and ctx's error when ctx
// ends first.
func (h *Handle) AwaitRecord(ctx context.Context) (*lockingv1alpha1.GrantRecord, error) {
	for {
		st, last, changed := h.changes()
		if err := h.Err(); err != nil {
			return nil, err
		}
		if last != nil && last.Status.Phase == lockingv1alpha1.PhaseHeld && (st == holder.Held || st == holder.Renewing) {
			return h.Record(), nil
		}
		select {
		case <-changed:
		case <-h.Done():
		case <-ctx.Done():
			return nil, fmt.Errorf("lock: waiting for the status of grant %s: %w", h.key, context.Cause(ctx))
		}
	}
}

// Proof returns the record in its compact signed form (status.proof,
// "lgv1.<record>.<signature>"), what a guarded write carries in annotation
// locking.lockwarden.io/proof and any verifier checks with the issuer's
// trust bundle; "" when the registry publishes none, or before the grant's
// status arrived (see Record).
func (h *Handle) Proof() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last == nil {
		return ""
	}
	return h.last.Status.Proof
}

// State returns the holder state machine's state (see package holder). It
// may go back to HELD after OWNERSHIP_UNKNOWN if a read proves a renew
// landed; the handle stays spent all the same.
func (h *Handle) State() holder.State {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m.Tick(h.mono())
	h.publish()
	return h.m.State()
}

// Done returns a channel closed the moment ownership becomes unknown or is
// lost, or the handle is released. Err then says why.
func (h *Handle) Done() <-chan struct{} { return h.ctx.Done() }

// Context returns a context cancelled when Done is closed, with Err's value
// as its cause (context.Cause). It carries the values of the context given
// to Acquire, but not its cancellation: the lock outlives the acquiring call.
// Derive the contexts of the work the lock protects from it.
func (h *Handle) Context() context.Context { return h.ctx }

// Err returns nil while Done is open, and afterwards why it closed:
// ErrOwnershipUnknown, ErrReleased, or an error wrapping ErrLost and the
// *fencing.Error that says why (errors.Is with fencing.ErrExpired,
// fencing.ErrRevoked, fencing.ErrAlreadyEnded, fencing.ErrUnknownGrant,
// fencing.ErrDriverMismatch, ...; fencing.ReasonOf gives the code).
func (h *Handle) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cause
}

// Remaining returns how long, on the local monotonic clock, the holder may
// still start effects: the local deadline minus now, or 0 when Check fails.
// Use it to bound an operation (a statement timeout, an RPC deadline).
func (h *Handle) Remaining() time.Duration {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.mono()
	h.m.Tick(now)
	h.publish()
	d, ok := h.m.Deadline()
	if h.cause != nil || !ok || !h.m.Valid(now) {
		return 0
	}
	return time.Duration(d - now)
}

// Check returns nil while the holder may start a new effect: the grant is
// HELD or RENEWING, the local deadline (judged now, on the monotonic clock)
// has not passed, and Done is open. Otherwise it returns Err (closing Done
// if the deadline just passed). Passing Check does not make a write safe:
// the enforcement point that checks the fence does.
func (h *Handle) Check() error {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.mono()
	h.m.Tick(now)
	h.publish()
	if h.cause != nil {
		return h.cause
	}
	if !h.m.Valid(now) {
		return ErrOwnershipUnknown
	}
	return nil
}

// publish applies the machine's state to the handle; h.mu held.
func (h *Handle) publish() {
	st := h.m.State()
	step := -1
	if st != h.lastState && h.trace != nil {
		h.traceStep(TraceEvent{Kind: TraceState, Previous: h.lastState})
		step = len(h.traceQ) - 1
	}
	if st == holder.Held || st == holder.Renewing {
		h.heldOnce = true
	} else if h.heldOnce && h.cause == nil {
		switch st {
		case holder.OwnershipUnknown:
			h.spend(ErrOwnershipUnknown)
		case holder.Released:
			if h.m.Releasing() {
				h.spend(ErrReleased)
			} else {
				h.spend(lost(h.m.Reason()))
			}
		default:
			h.spend(lost(h.m.Reason()))
		}
	}
	if step >= 0 {
		h.traceQ[step].Err = h.cause // the state change may have closed Done
	}
	if st != h.lastState {
		h.lastState = st
		h.bump()
		h.log.V(1).Info("Lock state changed", "grant", h.key, "state", st.String(), "reason", h.m.Reason())
	}
}

// spend closes Done with cause; h.mu held.
func (h *Handle) spend(cause error) {
	if h.cause != nil {
		return
	}
	h.cause = cause
	h.cancel(cause)
	h.traceStep(TraceEvent{Kind: TraceDone})
	if !errors.Is(cause, ErrReleased) {
		h.log.Info("Lock ownership ended", "grant", h.key, "resource", h.resource, "fence", h.m.Fence(), "cause", cause.Error())
	}
}

// observe applies one read and wakes the waiters on changed; h.mu held.
func (h *Handle) observe(now holder.Mono, g *lockingv1alpha1.LockGrant) {
	if g == nil || g.UID != h.uid {
		h.m.Observe(now, holder.Facts{Gone: true})
		return
	}
	h.last = g.DeepCopy()
	if h.fenceDisagrees(g) {
		h.log.Error(nil, "The grant's status names another fence than its resource's fence record did; stopping", "grant", h.key,
			"fence", h.m.Fence(), "statusFence", g.Status.FenceToken)
		h.end(now, &fencing.Error{Reason: fencing.ReasonBindingMismatch, Detail: fmt.Sprintf(
			"the grant's status names fence %d, its resource's fence record named fence %d", g.Status.FenceToken, h.m.Fence())})
		return
	}
	if h.fenced == "" && g.Status.Phase == lockingv1alpha1.PhaseHeld {
		h.permit, h.fenced = g.HeldSlot(), g.HeldFencedResource()
	}
	h.m.Observe(now, holder.FactsOf(g))
	h.bump()
}

// statusHeld reports whether the grant's status, as last read, says Held;
// h.mu held.
func (h *Handle) statusHeld() bool {
	return h.last != nil && h.last.Status.Phase == lockingv1alpha1.PhaseHeld
}

// bump wakes everyone waiting on changed; h.mu held.
func (h *Handle) bump() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// stopLoop ends the background loop and waits for it.
func (h *Handle) stopLoop() {
	h.stopOnce.Do(func() { close(h.stop) })
	<-h.stopped
}

// run is the handle's loop: it watches the grant (and, when it follows
// it, the resource's FenceCounter), renews on schedule,
// retries renews whose outcome is unknown, and ticks the machine at the
// local deadline. It returns when the machine is final or stopLoop is called.
func (h *Handle) run(ctx context.Context) {
	defer close(h.stopped)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	obs := make(chan observation, 4)
	go func() {
		_ = watchGrant(ctx, h.c.c, h.key, func(g *lockingv1alpha1.LockGrant) (bool, error) {
			select {
			case obs <- observation{g: g}:
				return false, nil
			case <-ctx.Done():
				return true, nil
			}
		})
	}()
	var counters chan *lockingv1alpha1.FenceCounter // nil: not followed
	if h.counter {
		counters = make(chan *lockingv1alpha1.FenceCounter, 4)
		go h.followCounter(ctx, counters)
	}
	renewed := make(chan renewResult, 1)
	var (
		inFlight          bool
		retryAt, readAt   holder.Mono
		hasRetry, hasRead bool
	)
	for {
		h.mu.Lock()
		now := h.mono()
		h.m.Tick(now)
		st := h.m.State()
		// A spent handle renews no more: its owner was told to stop. Nor
		// does one that learned it holds from the counter, until its
		// status says so too: admission judges a renew on the status.
		mayRenew := h.cause == nil && !inFlight && h.statusHeld()
		var target int64
		sendRenew := false
		if _, _, pending := h.m.PendingRenew(); !pending {
			hasRetry = false // settled by a read meanwhile
		}
		if mayRenew {
			at, due := h.m.NextRenew(now)
			if (due && at <= now) || (hasRetry && retryAt <= now) {
				target, sendRenew = h.m.RenewSent(now)
				inFlight, hasRetry = sendRenew, false
				if sendRenew {
					h.traceStep(TraceEvent{Kind: TraceRenewSent, Renewals: target})
				}
			}
		}
		sendRead := hasRead && readAt <= now
		if sendRead {
			hasRead = false
		}
		// The next instant something is due.
		var next holder.Mono
		hasNext := false
		wake := func(at holder.Mono) {
			if !hasNext || at < next {
				next, hasNext = at, true
			}
		}
		if mayRenew && !inFlight {
			if at, ok := h.m.NextRenew(now); ok {
				wake(at)
			}
			if hasRetry {
				wake(retryAt)
			}
		}
		if hasRead {
			wake(readAt)
		}
		if d, ok := h.m.Deadline(); ok && (st == holder.Held || st == holder.Renewing) {
			wake(d)
		}
		h.publish()
		h.mu.Unlock()
		h.flushTrace()

		if st.Final() {
			return
		}
		if sendRenew {
			go func(target int64) {
				g, err := h.c.patchSpec(ctx, h.target(), "renewals", target)
				renewed <- renewResult{target: target, g: g, err: err}
			}(target)
		}
		if sendRead {
			go func() {
				g, err := h.c.get(ctx, h.key)
				if err == nil && g != nil && g.UID == h.uid && h.driver != "" && g.Annotations[lockingv1alpha1.DriverAnnotation] != h.driver {
					// Another driver took the grant over: this one stops.
					select {
					case renewed <- renewResult{err: driverMismatch(g)}:
					case <-ctx.Done():
					}
					return
				}
				if err == nil {
					select {
					case obs <- observation{g: g}:
					case <-ctx.Done():
					}
				}
			}()
		}
		var timer clock.Timer
		var timerC <-chan time.Time
		if hasNext {
			if d := time.Duration(next - now); d > 0 {
				timer = h.clk.NewTimer(d)
				timerC = timer.C()
			} else {
				// Due already (the state changed meanwhile): go round again.
				closed := make(chan time.Time)
				close(closed)
				timerC = closed
			}
		}
		select {
		case <-timerC:
		case o := <-obs:
			h.mu.Lock()
			h.observe(h.mono(), o.g)
			h.mu.Unlock()
		case fc := <-counters:
			h.mu.Lock()
			h.observeCounter(h.mono(), fc)
			h.mu.Unlock()
		case r := <-renewed:
			inFlight = false
			h.mu.Lock()
			now := h.mono()
			if r.target != 0 {
				h.traceRenewAnswer(r)
			}
			switch ref := Refusal(r.err); {
			case r.err == nil:
				h.observe(now, r.g)
				if _, _, pending := h.m.PendingRenew(); pending {
					readAt, hasRead = now+holder.Mono(confirmWait), true
				}
			case ref != nil:
				h.log.V(1).Info("Renew refused", "grant", h.key, "reason", string(ref.Reason))
				h.m.Refused(now, ref.Reason)
				retryAt, hasRetry = now+holder.Mono(retryWait), true
			case errors.Is(r.err, errGone):
				h.m.Observe(now, holder.Facts{Gone: true})
			default:
				// Outcome unknown (lost reply, timeout, 409, 5xx): read the
				// grant to learn the truth, and resend the same renewals
				// value unless the read settles it first.
				h.log.V(1).Info("Renew outcome unknown", "grant", h.key, "error", r.err.Error())
				readAt, hasRead = now, true
				retryAt, hasRetry = now+holder.Mono(retryWait), true
			}
			h.mu.Unlock()
			h.flushTrace()
		case <-h.stop:
			if timer != nil {
				timer.Stop()
			}
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// Release ends exactly this acquisition (UID and driver-token preconditions) and
// stops the background renewal. Done is closed (cause ErrReleased, unless it
// was already closed) before the request is sent: no new effects from the
// moment Release is called. It returns nil when the registry accepted the
// release, and otherwise, as Client.Release, an error matching the
// refusal's fencing sentinel: fencing.ErrExpired (the lease had run out
// first), fencing.ErrAlreadyEnded (ended before, for example by an earlier
// Release of this handle), fencing.ErrRevoked, fencing.ErrNotOwner,
// fencing.ErrDriverMismatch, fencing.ErrUnknownGrant. An error matching none
// means no definite answer came before ctx ended; the handle then goes on
// releasing the grant on a context of its own, for up to 10 seconds, so
// that a caller that gave up does not leave the resource held until the
// lease runs out. Release may be called again: once that background
// release has a definite answer, Release returns it.
//
// Call it with a context that is not the handle's own (which is already
// cancelled when ownership was lost), e.g.
// context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second).
func (h *Handle) Release(ctx context.Context) error {
	h.releaseMu.Lock()
	defer h.releaseMu.Unlock()
	if h.finished {
		return h.finishErr
	}
	err := h.releaseLocked(ctx, false)
	if err != nil && fencing.ReasonOf(err) == "" && !h.finishing {
		h.finishing = true
		go h.finishRelease()
	}
	return err
}

// finishRelease goes on with a release whose outcome was unknown when its
// caller's context ended, on a context of its own bounded by
// withdrawTimeout.
func (h *Handle) finishRelease() {
	h.releaseMu.Lock()
	defer h.releaseMu.Unlock()
	h.finishing = false
	if h.finished {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	// The earlier attempt may have landed: an ALREADY_ENDED answer is then
	// this handle's own release.
	err := h.releaseLocked(ctx, true)
	if err != nil && fencing.ReasonOf(err) == "" {
		h.log.Error(err, "Releasing the grant failed; its lease will end it", "grant", h.key)
		h.stopLoop()
		return
	}
	h.finished, h.finishErr = true, err
}

// releaseLocked is Release; h.releaseMu held. again: an earlier attempt's
// outcome is unknown (see Client.release).
func (h *Handle) releaseLocked(ctx context.Context, again bool) error {
	defer h.flushTrace()
	h.mu.Lock()
	h.m.ReleaseSent(h.mono())
	h.spend(ErrReleased)
	h.publish()
	h.mu.Unlock()
	h.flushTrace()

	err := h.c.release(ctx, h.clk, h.target(), again)
	r := fencing.ReasonOf(err)
	if err != nil && r == "" {
		return err
	}
	h.mu.Lock()
	now := h.mono()
	if err == nil {
		h.m.ReleaseAccepted(now)
	} else {
		h.m.Refused(now, r)
	}
	h.publish()
	h.mu.Unlock()
	h.stopLoop()
	return err
}

// changes returns the current state, the last grant read, and a channel
// closed at the next state change.
func (h *Handle) changes() (holder.State, *lockingv1alpha1.LockGrant, <-chan struct{}) {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m.Tick(h.mono())
	h.publish()
	return h.m.State(), h.last, h.changed
}
