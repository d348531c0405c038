package lock

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// Acquire asks for the lock on resource and blocks until it is held, the
// wait limit (WithWait) passes, or ctx ends. It creates one LockGrant named
// after the request ID and follows it with a watch, never polling. The
// returned Handle is HELD: its local deadline, counted from the monotonic
// time the create (or a later renew) was sent, lies ahead, and it renews
// itself until Release.
//
// A create whose response was lost is retried under the same request ID
// and finds the same grant (AlreadyExists, then a read): an acquisition has
// exactly one identity. A grant found that way, or granted a renew interval
// (WithRenewInterval, a third of the TTL by default) or more after its
// create was sent, is confirmed by a renew before Acquire returns, because
// the holder cannot know when it was granted: a long wait costs one more
// round trip, and the Handle returned has at least TTL - margin -
// max(renew interval, that round trip) of validity left however long it
// waited (package holder).
//
// The grant is bound to this call's driver token (WithDriverToken): only this
// Handle renews and releases it. Another Acquire that finds it by the same
// request ID while it is Pending or Held is refused (fencing.ErrDriverMismatch)
// instead of becoming a second holder of one grant.
//
// Errors: ErrWaitTimeout when the wait limit passed; ctx's error when ctx
// ended first (the request is then withdrawn, also when ctx cut its create
// off before any answer came); ErrWithdrawn;
// ErrRequestIDConflict; ErrInvalidOption; a refusal matching its fencing
// sentinel when the grant of this request ID is driven by another process
// (fencing.ErrDriverMismatch) or ended before this call could confirm it
// held (fencing.ErrExpired, fencing.ErrAlreadyEnded, fencing.ErrRevoked,
// fencing.ErrUnknownGrant; never ErrLost: the caller held nothing); or the
// API server's error for a create that was definitely refused (RBAC, an
// invalid resource ID; a refusal by admission matches its fencing sentinel).
func (c *Client) Acquire(ctx context.Context, resource string, opts ...Option) (*Handle, error) {
	return c.acquire(ctx, resource, false, opts)
}

// TryAcquire asks for the lock on resource and returns as soon as the
// controller has answered the request once: the Handle when the resource
// was free (confirmed as in Acquire), or ErrBusy after withdrawing the
// request when it would have to wait. The wait for the first answer is
// bounded by ctx; it usually takes milliseconds. As a backstop the request
// carries a wait limit of a few seconds, so it ends in the registry even if
// the withdrawal is lost. WithWait is ignored.
func (c *Client) TryAcquire(ctx context.Context, resource string, opts ...Option) (*Handle, error) {
	return c.acquire(ctx, resource, true, opts)
}

// newRequest is the LockGrant that asks for resource with settings s: named
// after its request ID, with its options in its spec and annotations. try
// bounds its wait to tryWaitSeconds; generated says the request ID is a
// random one, which the registry need not remember.
func newRequest(s *settings, resource string, try, generated bool) *lockingv1alpha1.LockGrant {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.namespace,
			Name:      lockingv1alpha1.GrantNameForRequest(s.requestID),
			Labels:    map[string]string{lockingv1alpha1.RequestIDLabel: s.requestID},
		},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             resource,
			LeaseDurationSeconds: int32(s.ttl / time.Second),
			RequestID:            s.requestID,
			OperationRoot:        s.operationRoot,
			OperationClass:       s.operationClass,
			Policy:               s.policy,
		},
	}
	if len(s.annotations) > 0 {
		g.Annotations = maps.Clone(s.annotations)
	}
	if generated {
		// Nobody else knows a random ID: the registry need not remember
		// it once the grant is gone.
		if g.Annotations == nil {
			g.Annotations = map[string]string{}
		}
		g.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] = "true"
	}
	if s.driver != "" {
		if g.Annotations == nil {
			g.Annotations = map[string]string{}
		}
		g.Annotations[lockingv1alpha1.DriverAnnotation] = s.driver
	}
	if s.permits > 1 {
		// 1 is the default: an exclusive request stays the same object.
		g.Spec.Permits = s.permits
	}
	if s.lockDelay > 0 {
		g.Spec.LockDelaySeconds = int32((s.lockDelay + time.Second - 1) / time.Second)
	}
	switch {
	case try:
		g.Spec.WaitTimeoutSeconds = tryWaitSeconds
	case s.wait > 0:
		g.Spec.WaitTimeoutSeconds = int32((s.wait + time.Second - 1) / time.Second)
	}
	return g
}

// checkRequest says why options s cannot ask for resource: options that
// contradict each other, a resource ID that is not one, a stop grace that
// fits no lease or session. nil when they can.
func checkRequest(s *settings, resource string) error {
	if s.releaseByDelete && s.lockDelay > 0 {
		return fmt.Errorf("%w: release by delete with a lock-delay: a deleted grant counts as left without a release, so every release would wait out the delay", ErrInvalidOption)
	}
	if s.releaseByDelete && s.requestID != "" {
		return fmt.Errorf("%w: release by delete with a request ID: a request ID is recorded as spent only when the registry ends and deletes the grant", ErrInvalidOption)
	}
	if !lockingv1alpha1.ValidResourceID(resource) {
		return fmt.Errorf("%w: resource ID %q does not match %s", ErrInvalidOption, resource, lockingv1alpha1.ResourcePattern)
	}
	if s.stopGrace > 0 {
		if _, err := holder.New(holder.Config{TTL: s.ttl, Margin: s.leaseMargin(s.ttl), RenewInterval: s.renewInterval}); err != nil {
			return fmt.Errorf("%w: stop grace %s does not fit a %s lease: %w", ErrInvalidOption, s.stopGrace, s.ttl, err)
		}
		if sessionTTLFor(s.stopGrace) == 0 && !s.session.none {
			return fmt.Errorf("%w: stop grace %s does not fit a session of at most 1h", ErrInvalidOption, s.stopGrace)
		}
	}
	return nil
}

func (c *Client) acquire(ctx context.Context, resource string, try bool, opts []Option) (*Handle, error) {
	s := c.settings(opts)
	if s.err != nil {
		return nil, s.err
	}
	if err := checkRequest(s, resource); err != nil {
		return nil, err
	}
	generated := s.requestID == ""
	if generated {
		s.requestID = newRequestID()
	}
	if s.driver == "" && !s.detached {
		s.driver = newDriverToken()
	}
	if s.operationRoot == "" {
		sum := sha256.Sum256([]byte(s.requestID))
		s.operationRoot = "sha256:" + hex.EncodeToString(sum[:])
	}
	g := newRequest(s, resource, try, generated)
	// Session hook (session.go): the request lives as long as its client.
	sess, err := c.sessionFor(ctx, s)
	if err != nil {
		return nil, err
	}
	h := &Handle{
		c:         c,
		clk:       s.clk,
		origin:    s.clk.Now(),
		log:       logr.FromContextOrDiscard(ctx).WithName("lock"),
		key:       types.NamespacedName{Namespace: g.Namespace, Name: g.Name},
		resource:  resource,
		requestID: s.requestID,
		driver:    s.driver,
		timeout:   requestTimeoutFor(s.ttl),
		counter:   followsCounter(s),
		byDelete:  s.releaseByDelete,
		opRoot:    s.operationRoot,
		trace:     s.trace,
		changed:   make(chan struct{}),
		stop:      make(chan struct{}),
		stopped:   make(chan struct{}),
		stopGrace: s.stopGrace,
		armed:     make(chan struct{}),
	}
	if s.logger != nil {
		h.log = s.logger.WithName("lock")
	}
	h.ctx, h.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	sess, err = c.createUnder(ctx, h, g, s, sess)
	h.sess = sess
	if err != nil {
		h.cancel(err)
		if unknownOutcome(err) {
			// The create may have made the grant, or may still make it:
			// nobody but this call knows its name. End it now.
			h.withdrawUnknown(ctx, g)
		}
		return nil, err
	}
	// The loop outlives Done: after ownership is lost it keeps watching the
	// grant until it is final or released.
	go h.run(context.WithoutCancel(ctx))
	var sessionDone <-chan struct{}
	if sess != nil {
		sessionDone = sess.Done()
		go h.followSession()
	}

	var backstop <-chan time.Time
	if !try && s.wait > 0 {
		t := s.clk.NewTimer(s.wait + waitSlack)
		defer t.Stop()
		backstop = t.C()
	}
	var reported string
	for {
		st, last, changed := h.changes()
		if last != nil && s.progress != nil && st == holder.Requested && last.ResourceVersion != reported {
			reported = last.ResourceVersion
			s.progress(last.DeepCopy())
		}
		switch err := h.sessionEnd(); {
		case err != nil:
			h.withdraw(ctx)
			return nil, fmt.Errorf("lock: acquiring %s: %w", resource, err)
		case st == holder.Held || st == holder.Renewing:
			if err := h.armStopGrace(ctx); err != nil {
				h.withdraw(ctx)
				return nil, fmt.Errorf("lock: acquiring %s: %w", resource, err)
			}
			return h, nil
		case st.Final():
			h.stopLoop()
			return nil, h.acquireError(try)
		case try && last != nil && last.Status.Phase == lockingv1alpha1.PhasePending:
			h.withdraw(ctx)
			return nil, ErrBusy
		}
		select {
		case <-changed:
		case <-ctx.Done():
			h.withdraw(ctx)
			return nil, fmt.Errorf("lock: acquiring %s: %w", resource, context.Cause(ctx))
		case <-backstop:
			h.withdraw(ctx)
			return nil, ErrWaitTimeout
		case <-sessionDone:
			h.withdraw(ctx)
			return nil, fmt.Errorf("lock: acquiring %s: %w", resource, sess.Err())
		}
	}
}

// create makes the grant, retrying requests whose outcome is unknown under
// the same name, and adopts the grant it finds when the name exists.
func (h *Handle) create(ctx context.Context, g *lockingv1alpha1.LockGrant, s *settings) error {
	b := retryBackoff()
	for {
		obj := g.DeepCopy()
		sentAt := h.mono()
		cctx, cancel := context.WithTimeout(ctx, h.timeout)
		err := h.c.c.Create(cctx, obj)
		cancel()
		switch {
		case err == nil:
			if err := h.adopt(obj, s); err != nil {
				return err
			}
			// This request made the grant, so it was granted after sentAt.
			h.m.Created(sentAt)
			if ended, ok := obj.Annotations[lockingv1alpha1.ReusedRequestIDAnnotation]; ok {
				h.log.Info("The request ID was spent by an earlier grant whose window passed; this acquisition runs as a new attempt",
					"grant", h.key, "requestID", g.Spec.RequestID, "earlierGrantEnded", ended)
			}
			return nil
		case apierrors.IsAlreadyExists(err):
			cur, gerr := h.c.get(ctx, h.key)
			switch {
			case gerr != nil:
				err = gerr
			case cur == nil:
				// The grant of this request ID existed a moment ago and is
				// gone: it ended and was deleted, or it was deleted while
				// it lived (a forced release). Either way its acquisition
				// is over, and creating it again would run the attempt a
				// second time.
				return fmt.Errorf("lock: acquiring %s: %w", g.Spec.Resource, &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: fmt.Sprintf(
					"grant %s of request ID %q was deleted while this call looked it up (its retention ended, or it was force-released); the request ID is spent, acquire with a new one",
					h.key, g.Spec.RequestID)})
			case !sameRequest(cur, g):
				return fmt.Errorf("%w: grant %s is for resource %q, request %q, operation %q (%s), policy %q, %d permit(s)", ErrRequestIDConflict,
					h.key, cur.Spec.Resource, cur.Spec.RequestID, cur.Spec.OperationRoot, cur.Spec.OperationClass, cur.Spec.Policy, cur.Spec.EffectivePermits())
			case cur.Status.Phase.Final():
				// The request ID is spent: its acquisition is over.
				return fmt.Errorf("lock: acquiring %s: grant %s of request ID %q has ended (%s); the request ID is spent, acquire with a new one: %w",
					g.Spec.Resource, h.key, g.Spec.RequestID, cur.Status.Phase, spentRefusal(cur.Status.Phase))
			case cur.Annotations[lockingv1alpha1.DriverAnnotation] != s.driver:
				return fmt.Errorf("lock: acquiring %s: %w", g.Spec.Resource, driverMismatch(cur))
			default:
				// Our own earlier attempt (the same driver token): the same
				// acquisition, of unknown age.
				h.log.V(1).Info("Found the grant of this request ID", "grant", h.key, "uid", cur.UID)
				return h.adopt(cur, s)
			}
		case !retryable(err):
			return fmt.Errorf("lock: creating grant for %s: %w", g.Spec.Resource, denial.Wrap(err))
		}
		h.log.V(1).Info("Create outcome unknown; retrying with the same request ID", "grant", h.key, "error", err.Error())
		select {
		case <-ctx.Done():
			return &outcomeUnknown{err: fmt.Errorf("lock: creating grant for %s, outcome unknown: %w", g.Spec.Resource, errors.Join(context.Cause(ctx), err))}
		case <-h.clk.After(b.Step()):
		}
	}
}

// sameRequest reports whether grant cur is the request g describes: the
// same request ID, resource, operation, policy and permits.
func sameRequest(cur, g *lockingv1alpha1.LockGrant) bool {
	return cur.Spec.RequestID == g.Spec.RequestID && cur.Spec.Resource == g.Spec.Resource &&
		cur.Spec.OperationRoot == g.Spec.OperationRoot && cur.Spec.OperationClass == g.Spec.OperationClass && cur.Spec.Policy == g.Spec.Policy &&
		cur.Spec.EffectivePermits() == g.Spec.EffectivePermits()
}

// outcomeUnknown is the error of a create that ctx ended before any answer
// said whether it made the grant: it may have, or may still.
type outcomeUnknown struct{ err error }

func (e *outcomeUnknown) Error() string { return e.err.Error() }
func (e *outcomeUnknown) Unwrap() error { return e.err }

// unknownOutcome reports whether err is a create's outcomeUnknown.
func unknownOutcome(err error) bool {
	var u *outcomeUnknown
	return errors.As(err, &u)
}

// withdrawUnknown ends the request g whose create's outcome is unknown, so
// that no grant of it is ever left waiting or holding with nobody to renew
// or release it. The grant's name is the request's one identity, so a
// create of the same name settles the question: it creates the request
// already withdrawn (spec.release), which the controller ends without ever
// granting it and after which the lost create can no longer land
// (AlreadyExists), or it finds the grant the lost create made, which is
// then released with its UID and driver token as preconditions. A grant of
// the name that is not this request's (another driver's, another request's)
// is left alone. It runs on a context of its own, bounded by
// withdrawTimeout, whatever happened to ctx, and spends the request ID.
func (h *Handle) withdrawUnknown(ctx context.Context, g *lockingv1alpha1.LockGrant) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	twin := g.DeepCopy()
	twin.Spec.Release = true
	// A withdrawn request needs no liveness; nor must a lapsed session
	// keep it from being made.
	twin.Spec.Session = nil
	b := retryBackoff()
	for {
		done, err := h.withdrawOnce(ctx, twin)
		if done {
			return
		}
		select {
		case <-ctx.Done():
			h.log.Error(errors.Join(err, ctx.Err()), "Withdrawing a request whose create's outcome is unknown failed; its wait limit, session or lease will end it", "grant", h.key)
			return
		case <-h.clk.After(b.Step()):
		}
	}
}

// withdrawOnce makes one attempt of withdrawUnknown: true once the request
// is settled (withdrawn, ended, or not this request's).
func (h *Handle) withdrawOnce(ctx context.Context, twin *lockingv1alpha1.LockGrant) (bool, error) {
	obj := twin.DeepCopy()
	cctx, cancel := context.WithTimeout(ctx, h.timeout)
	err := h.c.c.Create(cctx, obj)
	cancel()
	switch {
	case err == nil:
		h.log.V(1).Info("Withdrew a request whose create's outcome was unknown", "grant", h.key, "uid", obj.UID)
		return true, nil
	case retryable(err):
		return false, err
	case apierrors.IsAlreadyExists(err):
	case fencing.ReasonOf(denial.Wrap(err)) != fencing.ReasonInvalidSpec:
		// Refused for what the lost create carries too (the owner, the
		// policy, a spent request ID): that one cannot land either.
		return true, nil
	}
	// The name is taken, or the registry does not take a request that is
	// withdrawn at creation (an earlier version): look for the lost
	// create's grant, which may still land.
	cur, err := h.c.get(ctx, h.key)
	switch {
	case err != nil:
		return false, err
	case cur == nil:
		return false, nil // not made yet, or deleted meanwhile: again
	case !sameRequest(cur, twin) || cur.Annotations[lockingv1alpha1.DriverAnnotation] != h.driver:
		return true, nil // not this request's grant
	case cur.Status.Phase.Final() || cur.Spec.Release:
		return true, nil
	}
	_, err = h.c.patchSpec(ctx, target{key: h.key, uid: cur.UID, driver: h.driver, timeout: h.timeout}, "release", true)
	switch {
	case err == nil:
		h.log.V(1).Info("Withdrew a request whose create's outcome was unknown", "grant", h.key, "uid", cur.UID)
		return true, nil
	case errors.Is(err, errGone), Refusal(err) != nil:
		return true, nil // ended, or no longer this request: nothing to withdraw
	}
	return false, err
}

// adopt binds the handle to grant g and builds its state machine from g's
// TTL (the registry's, which an adopted grant may have chosen differently).
func (h *Handle) adopt(g *lockingv1alpha1.LockGrant, s *settings) error {
	h.uid, h.owner = g.UID, g.Spec.Owner
	h.ttl = time.Duration(g.Spec.LeaseDurationSeconds) * time.Second
	m, err := holder.New(holder.Config{TTL: h.ttl, Margin: s.leaseMargin(h.ttl), RenewInterval: s.renewInterval})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m = m
	h.lastState = m.State()
	h.observe(h.mono(), g)
	return nil
}

// withdraw releases the request after Acquire gave up on it, so that it is
// never granted later (or, if it just was, so that the resource is freed).
func (h *Handle) withdraw(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	if err := h.Release(rctx); err != nil && fencing.ReasonOf(err) == "" {
		h.log.Error(err, "Withdrawing the request failed; its wait limit or lease will end it", "grant", h.key)
	}
	h.stopLoop()
}

// acquireError says why a request ended without being held.
func (h *Handle) acquireError(try bool) error {
	h.mu.Lock()
	reason := h.m.Reason()
	h.mu.Unlock()
	switch reason {
	case fencing.ReasonTimedOut:
		if try {
			return ErrBusy
		}
		return ErrWaitTimeout
	case fencing.ReasonReleased:
		return ErrWithdrawn
	}
	// The caller never held the lock: not "ownership lost".
	return fmt.Errorf("lock: acquiring %s: grant %s ended before this call could confirm it held it: %w", h.resource, h.key, refusalOf(reason))
}

// spentRefusal is the refusal of a retry that finds its request ID's grant
// ended in phase p: the code the registry gives once the grant is deleted
// (fencing.SpentReason), with the detail of the phase's own refusal.
func spentRefusal(p lockingv1alpha1.LockGrantPhase) *fencing.Error {
	e := refusalOf(phaseReason(p))
	e.Reason = fencing.SpentReason(facts.State(p))
	return e
}

// phaseReason is the catalog code of a final phase.
func phaseReason(p lockingv1alpha1.LockGrantPhase) fencing.Reason {
	switch p {
	case lockingv1alpha1.PhaseExpired:
		return fencing.ReasonExpired
	case lockingv1alpha1.PhaseTimedOut:
		return fencing.ReasonTimedOut
	case lockingv1alpha1.PhaseRevoked:
		return fencing.ReasonRevoked
	}
	return fencing.ReasonReleased
}

// newDriverToken returns a random driver token: 32 hex digits.
func newDriverToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
