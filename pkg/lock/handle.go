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
// It renews the lease in the background and ends its Context the moment
// the holder can no longer prove it holds the lock. All methods are safe
// for concurrent use.
//
// A Handle is spent once its Context has ended: Check, Stamp and
// NextSegment fail from then on, even if a later read shows the grant
// still held. Acquire again for a new fence, and Release this one.
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
	// byDelete: Release deletes the grant (WithReleaseByDelete).
	byDelete bool
	// sess is the session the request was made under (nil: none), set
	// before the handle is used; stopGrace is WithStopGrace, which counts
	// against the session once armed is closed (armStopGrace).
	sess      *Session
	stopGrace time.Duration
	armed     chan struct{}

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
	// cause is non-nil once ctx is cancelled (spend), with it as its cause.
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

// renewResult is the answer to one renew request (target > 0), or a
// refusal a read of the grant found (target 0).
type renewResult struct {
	target int64
	g      *lockingv1alpha1.LockGrant
	err    error
}

func (h *Handle) mono() holder.Mono { return holder.Mono(h.clk.Since(h.origin)) }

// Info is what identifies one acquisition and the fence it holds: what a
// holder passes on to its logs, to a store, or to a command it runs. The
// Info of a Handle that Acquire returned never changes.
type Info struct {
	// Grant is the LockGrant's namespace and name. Its namespace is the
	// namespace the resource ID and the fence belong to.
	Grant types.NamespacedName
	// UID is the LockGrant's UID: the identity of this acquisition, which
	// every renew and the release carry as a precondition.
	UID types.UID
	// Resource is the resource ID the lock is on (spec.resource).
	Resource string
	// Fence is the grant's fencing token (status.fenceToken): strictly
	// larger than every token issued before for FencedResource. Every
	// protected write carries it (Handle.Stamp, Handle.NextSegment).
	Fence int64
	// Permit is the slot the grant holds (status.permit), from 0 to the
	// resource's permits minus 1 (WithPermits): 0 for an exclusive lock.
	Permit int32
	// FencedResource is the fenced resource ID of that slot
	// (status.fencedResource): the ID the fence belongs to, that the signed
	// record names, and that guarded objects and store rows written under
	// the handle are bound to. It is Resource for an exclusive lock and for
	// slot 0, and Resource followed by "#k" for slot k
	// (api/v1alpha1.SlotResource).
	FencedResource string
	// RequestID is the request ID the grant is named after (WithRequestID,
	// or a random one).
	RequestID string
	// Owner is the grant's owner identity (spec.owner): the Kubernetes
	// user the client authenticated as.
	Owner string
	// OperationRoot is the grant's operation root (spec.operationRoot),
	// shared by every segment and retry of the operation.
	OperationRoot string
	// TTL is the lease duration (spec.leaseDurationSeconds).
	TTL time.Duration
}

// Info returns the acquisition's identity and fence (see Info). It is
// read once the grant is Held, which it is when Acquire returns it.
func (h *Handle) Info() Info {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Info{
		Grant:          h.key,
		UID:            h.uid,
		Resource:       h.resource,
		Fence:          h.m.Fence(),
		Permit:         h.permit,
		FencedResource: h.fencedLocked(),
		RequestID:      h.requestID,
		Owner:          h.owner,
		OperationRoot:  h.opRoot,
		TTL:            h.ttl,
	}
}

// fencedLocked is Info.FencedResource; h.mu held. It is the resource ID
// until a read shows the grant Held in a slot.
func (h *Handle) fencedLocked() string {
	if h.fenced == "" {
		return h.resource
	}
	return h.fenced
}

// DriverToken returns the driver token the grant is bound to (annotation
// locking.lockwarden.io/driver), "" for a detached grant. A process that
// saves it can resume the same attempt after a restart with
// WithDriverToken and the same request ID. It is not part of Info, which
// is meant to be logged and passed on: keep it as private as a credential.
func (h *Handle) DriverToken() string { return h.driver }

// target is this acquisition, for requests.
func (h *Handle) target() target {
	return target{key: h.key, uid: h.uid, driver: h.driver, timeout: h.timeout}
}

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
// cluster. It returns the cause of the handle's Context when that ends
// first, and ctx's cause when ctx ends first.
func (h *Handle) AwaitRecord(ctx context.Context) (*lockingv1alpha1.GrantRecord, error) {
	for {
		st, last, changed := h.changes()
		if err := context.Cause(h.ctx); err != nil {
			return nil, err
		}
		if last != nil && last.Status.Phase == lockingv1alpha1.PhaseHeld && (st == holder.Held || st == holder.Renewing) {
			return h.Record(), nil
		}
		select {
		case <-changed:
		case <-h.ctx.Done():
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

// Context returns the handle's context: cancelled the moment the holder
// can no longer prove it holds the lock, with the reason as its cause
// (context.Cause): ErrOwnershipUnknown (the local deadline passed without
// a confirmed renew, or the session no longer keeps the handle valid: then
// wrapping ErrSessionExpired too), ErrReleased (Release was called), or an
// error wrapping ErrLost and the *fencing.Error that says why the registry
// ended the acquisition (errors.Is with fencing.ErrExpired,
// fencing.ErrRevoked, fencing.ErrGrantReleased (released by someone else;
// it matches fencing.ErrAlreadyEnded too), fencing.ErrAlreadyEnded,
// fencing.ErrUnknownGrant, fencing.ErrDriverMismatch, ...; fencing.ReasonOf
// gives the code). The
// cause is nil while the context runs, and never changes once set.
//
// It is cancelled no later than the local deadline (see Check), on the
// handle's clock. It carries the values of the context given to Acquire,
// but not its cancellation: the lock outlives the acquiring call. Derive
// the contexts of the work the lock protects from it.
func (h *Handle) Context() context.Context { return h.ctx }

// Check judges, now, whether the holder may start a new effect: the grant
// is HELD or RENEWING, the local deadline has not passed, the session
// still keeps the handle valid, and the Context has not ended. It returns
// how long, on the local monotonic clock, the holder may still start
// effects, and nil; or 0 and the cause of the Context (cancelling it if
// the deadline has just passed). Use the duration to bound an operation (a
// statement timeout, an RPC deadline).
//
// The local deadline is the earlier of the lease's (TTL - margin after
// the last confirmed renew was sent) and the session's (its validity after
// its last confirmed renewal was sent), each less the stop grace
// (WithStopGrace): no later than the registry can end the grant either
// way. Passing Check does not make a write safe: the enforcement point
// that checks the fence does.
func (h *Handle) Check() (time.Duration, error) {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.mono()
	h.m.Tick(now)
	h.publish()
	if h.cause != nil {
		return 0, h.cause
	}
	d, ok := h.m.Deadline()
	if !ok || !h.m.Valid(now) {
		return 0, ErrOwnershipUnknown
	}
	if err := h.sessionEnd(); err != nil {
		h.spend(unknownBy(err))
		h.bump()
		return 0, h.cause
	}
	left := time.Duration(d - now)
	if h.sess != nil {
		left = min(left, h.sess.validFor(h.sessionGrace()))
	}
	return left, nil
}

// State returns the holder state machine's state (see package holder):
// after the Context has ended, it says whether the handle is still
// learning the grant's fate (OWNERSHIP_UNKNOWN) or the acquisition has
// ended for good (EXPIRED, RELEASED). It may go back to HELD after
// OWNERSHIP_UNKNOWN if a read proves a renew landed; the handle stays
// spent all the same. Decide on Check or the Context, not on State.
func (h *Handle) State() holder.State {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m.Tick(h.mono())
	h.publish()
	return h.m.State()
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
		h.traceQ[step].Err = h.cause // the state change may have spent the handle
	}
	if st != h.lastState {
		h.lastState = st
		h.bump()
		h.log.V(1).Info("Lock state changed", "grant", h.key, "state", st.String(), "reason", h.m.Reason())
	}
}

// spend cancels the handle's context with cause; h.mu held.
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
// it, the resource's FenceCounter), sends the renews and reads its
// schedule says are due, and ticks the machine at the local deadline. It
// returns when the machine is final or stopLoop is called.
func (h *Handle) run(ctx context.Context) {
	defer close(h.stopped)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	obs := make(chan observation, 4)
	go h.followGrant(ctx, obs)
	var counters chan *lockingv1alpha1.FenceCounter // nil: not followed
	if h.counter {
		counters = make(chan *lockingv1alpha1.FenceCounter, 4)
		go h.followCounter(ctx, counters)
	}
	answers := make(chan renewResult, 1)
	var sched schedule
	for {
		now, st, next := h.due(&sched)
		if st.Final() {
			return
		}
		if next.renew != 0 {
			go h.renew(ctx, next.renew, answers)
		}
		if next.read {
			go h.read(ctx, obs, answers)
		}
		wake, stopTimer := next.timer(h.clk, now)
		select {
		case <-wake:
		case o := <-obs:
			h.mu.Lock()
			h.observe(h.mono(), o.g)
			h.mu.Unlock()
		case fc := <-counters:
			h.mu.Lock()
			h.observeCounter(h.mono(), fc)
			h.mu.Unlock()
		case r := <-answers:
			h.answered(&sched, r)
		case <-h.stop:
			stopTimer()
			return
		}
		stopTimer()
	}
}

// due ticks the machine to now, takes the schedule's next step (recording
// a renew it sends) and publishes the state. It returns now, the state and
// the step.
func (h *Handle) due(sched *schedule) (holder.Mono, holder.State, step) {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.mono()
	st := h.m.Tick(now)
	// A spent handle renews no more: its owner was told to stop. Nor does
	// one that learned it holds from the counter, until its status says so
	// too: admission judges a renew on the status.
	next := sched.next(now, h.m, h.cause == nil && h.statusHeld())
	if next.renew != 0 {
		h.traceStep(TraceEvent{Kind: TraceRenewSent, Renewals: next.renew})
	}
	h.publish()
	return now, st, next
}

// followGrant watches the grant and sends every state of it (nil while it
// does not exist) to obs, until ctx ends.
func (h *Handle) followGrant(ctx context.Context, obs chan<- observation) {
	_ = watchGrant(ctx, h.c.c, h.clk, h.key, func(g *lockingv1alpha1.LockGrant) (bool, error) {
		select {
		case obs <- observation{g: g}:
			return false, nil
		case <-ctx.Done():
			return true, nil
		}
	})
}

// renew sends the renew that sets spec.renewals to target and passes its
// answer on.
func (h *Handle) renew(ctx context.Context, target int64, answers chan<- renewResult) {
	g, err := h.c.patchSpec(ctx, h.target(), "renewals", target)
	select {
	case answers <- renewResult{target: target, g: g, err: err}:
	case <-ctx.Done():
	}
}

// read reads the grant once and passes it on as an observation, or, when
// another driver has taken the grant over, that refusal as an answer: this
// handle then stops.
func (h *Handle) read(ctx context.Context, obs chan<- observation, answers chan<- renewResult) {
	g, err := h.c.get(ctx, h.key)
	if err != nil {
		return // the schedule resends the renew; the watch goes on
	}
	if g != nil && g.UID == h.uid && h.driver != "" && g.Annotations[lockingv1alpha1.DriverAnnotation] != h.driver {
		select {
		case answers <- renewResult{err: driverMismatch(g)}:
		case <-ctx.Done():
		}
		return
	}
	select {
	case obs <- observation{g: g}:
	case <-ctx.Done():
	}
}

// answered applies the answer to a renew, or a refusal a read found, to
// the machine and the schedule.
func (h *Handle) answered(sched *schedule, r renewResult) {
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.mono()
	if r.target == 0 {
		// Not a renew's answer: the renew in flight, if any, is still out.
		h.m.Refused(now, fencing.ReasonOf(r.err))
		return
	}
	h.traceRenewAnswer(r)
	switch ref := Refusal(r.err); {
	case r.err == nil:
		h.observe(now, r.g)
		_, _, unconfirmed := h.m.PendingRenew()
		sched.accepted(now, unconfirmed)
	case ref != nil:
		h.log.V(1).Info("Renew refused", "grant", h.key, "reason", string(ref.Reason))
		h.m.Refused(now, ref.Reason)
		sched.refused(now)
	case errors.Is(r.err, errGone):
		h.m.Observe(now, holder.Facts{Gone: true})
		sched.gone()
	default:
		// Outcome unknown (lost reply, timeout, 409, 5xx): read the grant
		// to learn the truth, and resend the same renewals value unless
		// the read settles it first.
		h.log.V(1).Info("Renew outcome unknown", "grant", h.key, "error", r.err.Error())
		sched.unknown(now)
	}
}

// Release ends exactly this acquisition (UID and driver-token preconditions) and
// stops the background renewal. The handle's Context is cancelled (cause
// ErrReleased, unless it had ended already) before the request is sent: no
// new effects from the moment Release is called. It returns nil when the registry accepted the
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
	var seen *lockingv1alpha1.LockGrant
	if h.last != nil {
		seen = h.last.DeepCopy()
	}
	h.mu.Unlock()
	h.flushTrace()

	var err error
	if h.byDelete {
		err = h.c.releaseByDelete(ctx, h.clk, h.target(), seen, again)
	} else {
		err = h.c.release(ctx, h.clk, h.target(), again)
	}
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
