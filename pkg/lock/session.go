package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// DefaultSessionTTL is the duration of a session Lease without
// WithSessionTTL: 5 seconds, renewed every third of it. A request whose
// client died is withdrawn about fencing.SessionLapse(DefaultSessionTTL)
// (6 s) after the client's last renewal.
const DefaultSessionTTL = 5 * time.Second

// ErrSessionExpired means the client's session could not be renewed before its
// local deadline, or its Lease is gone. The registry withdraws the
// session's requests and ends its grants; handles made under it are spent
// (the cause of their Context wraps ErrOwnershipUnknown and
// ErrSessionExpired).
var ErrSessionExpired = errors.New("lock: session expired")

// Session is the liveness of one client process: a coordination.k8s.io/v1
// Lease, labeled locking.lockwarden.io/session=true and held by the
// client's own identity, that the session renews in the background. Every
// request made under it names it (spec.session), so that when the process
// dies the registry withdraws its waiting requests and ends its grants a
// few seconds later instead of granting a request nobody follows (etcd's
// concurrency.Session does the same for its mutex keys, Chubby for its
// handles).
//
// The registry counts a session lapsed fencing.SessionLapse(TTL) (TTL + 1 s)
// after it last saw the Lease change, by its own clock, and then ends the
// session's grants. The session counts itself valid until TTL minus a
// margin (a tenth of TTL, at least 500 ms) after it sent its last renewal
// that was accepted, on the local monotonic clock, and spends every handle
// made under it at that instant: a paused process stops producing effects
// before the registry drops it, whatever its wall clock says. A handle's
// local deadline (Handle.Check) is never later than its session's.
//
// By default a Client creates one Session on its first Acquire and shares it
// among all its requests; Client.Close ends it. The Client's scheme must
// include client-go's (coordination/v1, authentication/v1), and the caller
// needs create, patch and delete on leases in the namespace; without them
// requests are made without a session (see WithoutSession).
type Session struct {
	c      client.WithWatch
	clk    clock.WithTicker
	origin time.Time
	key    types.NamespacedName
	uid    types.UID

	mu sync.Mutex
	// ttl is the Lease's duration as far as a confirmed write says; it
	// only grows (lengthen).
	ttl      time.Duration
	deadline time.Duration // since origin, on the monotonic clock
	cause    error
	done     chan struct{}
	// lengthening serializes lengthen.
	lengthening sync.Mutex

	stopOnce sync.Once
	stop     chan struct{}
	stopped  chan struct{}
}

// sessionSettings are the session choices of one Acquire.
type sessionSettings struct {
	none    bool
	session *Session
	ttl     time.Duration
}

// WithoutSession makes the request without a session: it has no liveness
// beyond its wait limit and its lease, as a LockGrant created by hand. Use
// it for grants that outlive the process (kubectl lockwarden acquire).
func WithoutSession() Option {
	return func(s *settings) { s.session.none = true }
}

// WithSession makes the request under session instead of the Client's own.
func WithSession(session *Session) Option {
	return func(s *settings) {
		if session == nil {
			s.fail("nil session")
		}
		s.session.session = session
	}
}

// WithSessionTTL sets the duration of the session the Client creates: whole
// seconds from 1 to 3600. Shorter sessions withdraw a dead client's
// requests sooner; longer ones tolerate longer pauses. Default
// DefaultSessionTTL. Used only when the Client's session is created.
func WithSessionTTL(d time.Duration) Option {
	return func(s *settings) {
		if d%time.Second != 0 || d < time.Second || d > time.Hour {
			s.fail("session TTL %s is not a whole number of seconds from 1 to 3600", d)
		}
		s.session.ttl = d
	}
}

// NewSession creates a session Lease in namespace ns, held by the identity
// the client authenticates as, and renews it until Close or until it is lost
// (Done). ttl is whole seconds from 1 to 3600 (0: DefaultSessionTTL).
func NewSession(ctx context.Context, c client.WithWatch, ns string, ttl time.Duration) (*Session, error) {
	return newSession(ctx, c, ns, ttl, clock.RealClock{})
}

func newSession(ctx context.Context, c client.WithWatch, ns string, ttl time.Duration, clk clock.WithTicker) (*Session, error) {
	if ttl == 0 {
		ttl = DefaultSessionTTL
	}
	if ttl%time.Second != 0 || ttl < time.Second || ttl > time.Hour {
		return nil, fmt.Errorf("%w: session TTL %s is not a whole number of seconds from 1 to 3600", ErrInvalidOption, ttl)
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := retrying(ctx, clk, func(rctx context.Context) error { return c.Create(rctx, review) }); err != nil {
		return nil, fmt.Errorf("lock: learning the client's identity for its session: %w", err)
	}
	s := &Session{
		c: c, clk: clk, origin: clk.Now(), ttl: ttl,
		done: make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	now := metav1.NewMicroTime(clk.Now())
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    ns,
			GenerateName: "lw-session-",
			Labels:       map[string]string{lockingv1alpha1.SessionLabel: "true"},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(review.Status.UserInfo.Username),
			LeaseDurationSeconds: ptr.To(int32(ttl / time.Second)),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	var sent time.Duration
	// A create whose reply was lost leaves a Lease nobody renews behind;
	// it holds nothing and no request names it.
	if err := retrying(ctx, clk, func(rctx context.Context) error {
		sent = s.mono()
		obj := l.DeepCopy()
		if err := c.Create(rctx, obj); err != nil {
			return err
		}
		l = obj
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lock: creating the session lease: %w", err)
	}
	s.key, s.uid = client.ObjectKeyFromObject(l), l.UID
	s.deadline = sent + sessionValidity(ttl)
	go s.keep(logf.FromContext(ctx).WithName("lock-session"))
	return s, nil
}

// retrying calls fn with a per-request timeout, again after a pause on clk
// while its error is transient, until it succeeds, fails for good or ctx
// ends.
func retrying(ctx context.Context, clk clock.WithTicker, fn func(context.Context) error) error {
	backoff := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := fn(rctx)
		cancel()
		if err == nil || !retryable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(context.Cause(ctx), err)
		case <-clk.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// sessionValidity is how long after a renewal of a session of ttl is sent
// the session counts itself valid: the registry's lapse
// (fencing.SessionLapse, which it counts from an observation made after
// the send) less sessionSafety(ttl). That is ttl minus a tenth of it, at
// least 500 ms less: 4.5 s for 5 s.
func sessionValidity(ttl time.Duration) time.Duration {
	return fencing.SessionLapse(ttl) - sessionSafety(ttl)
}

// sessionSafety is how long before the registry's earliest lapse of a
// session of ttl the session's local deadline comes: fencing.SessionMargin,
// which the registry grants itself to observe a renewal and which the
// client does not count on, plus a tenth of ttl (at least 500 ms) for the
// two clocks' rates. A handle's work that stops by that deadline
// (WithStopGrace) has stopped at least this long before the registry can
// end its grant for the lapsed session.
func sessionSafety(ttl time.Duration) time.Duration {
	return fencing.SessionMargin + max(ttl/10, 500*time.Millisecond)
}

// TTL returns the duration of the session's Lease: the one it was created
// with, or a longer one a handle's stop grace needed (WithStopGrace).
func (s *Session) TTL() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ttl
}

// leaves reports whether a session of ttl leaves a handle with stop grace
// grace (WithStopGrace) two scheduled renewals of the session before the
// handle's session deadline (the session's validity less grace after a
// confirmed renewal was sent): a renewal and a retry, as kubectl
// lockwarden run leaves before its lease's local deadline.
func leaves(ttl, grace time.Duration) bool {
	return sessionValidity(ttl)-2*(ttl/3) >= grace
}

// sessionTTLFor returns the shortest session TTL, in whole seconds and at
// least DefaultSessionTTL, that leaves a handle room for stop grace grace
// (leaves): about 4.3 x grace, 30 s for 7 s. It returns 0 when no TTL up
// to an hour does.
func sessionTTLFor(grace time.Duration) time.Duration {
	for ttl := DefaultSessionTTL; ttl <= time.Hour; ttl += time.Second {
		if leaves(ttl, grace) {
			return ttl
		}
	}
	return 0
}

// validFor returns how long, on the session's monotonic clock, a handle
// with stop grace grace may still count on the session: its local
// deadline less grace, less now (0 or less: no longer).
func (s *Session) validFor(grace time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline - grace - s.mono()
}

func (s *Session) mono() time.Duration { return s.clk.Since(s.origin) }

// Ref returns the reference a request puts in spec.session.
func (s *Session) Ref() *lockingv1alpha1.SessionRef {
	return &lockingv1alpha1.SessionRef{Name: s.key.Name, UID: string(s.uid)}
}

// Lease returns the namespace and name of the session Lease.
func (s *Session) Lease() types.NamespacedName { return s.key }

// Done is closed when the session is lost or closed; Err says why.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns nil while the session is valid, then an error wrapping
// ErrSessionExpired (or ErrReleased after Close).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cause
}

func (s *Session) end(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cause == nil {
		s.cause = cause
		close(s.done)
	}
}

// keep renews the Lease every third of its TTL, retries a failed renewal
// until the local deadline, and ends the session at that deadline.
func (s *Session) keep(log interface{ Info(string, ...any) }) {
	defer close(s.stopped)
	next := s.clk.NewTimer(s.TTL() / 3)
	defer next.Stop()
	for {
		s.mu.Lock()
		left := s.deadline - s.mono()
		s.mu.Unlock()
		if left <= 0 {
			s.end(fmt.Errorf("%w: no renewal of lease %s was confirmed in time", ErrSessionExpired, s.key))
			log.Info("Session lost", "lease", s.key.String())
			return
		}
		expire := s.clk.NewTimer(left)
		select {
		case <-s.stop:
			expire.Stop()
			return
		case <-s.done: // counted lost elsewhere (admission refused it)
			expire.Stop()
			return
		case <-expire.C():
			continue
		case <-next.C():
		}
		expire.Stop()
		sent, ttl := s.mono(), s.TTL()
		err := s.renew(context.Background(), ttl, false)
		switch {
		case err == nil:
			s.confirm(sent, ttl)
			next.Reset(s.TTL() / 3)
		case apierrors.IsNotFound(err) || preconditionFailed(err):
			s.end(fmt.Errorf("%w: lease %s is gone", ErrSessionExpired, s.key))
			log.Info("Session lost", "lease", s.key.String(), "error", err.Error())
			return
		default:
			next.Reset(min(ttl/3, max(ttl/10, 200*time.Millisecond)))
		}
	}
}

// confirm records that a renewal sent at sent, when the Lease's duration
// was at least ttl, was stored: the registry then counts the session lapsed
// no earlier than fencing.SessionLapse(ttl) after sent, and the session
// counts itself valid until sent + sessionValidity(ttl). A renewal sent
// after the deadline passed does not revive the session.
func (s *Session) confirm(sent, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cause != nil {
		return
	}
	s.ttl = max(s.ttl, ttl)
	if d := sent + sessionValidity(ttl); d > s.deadline && sent < s.deadline {
		s.deadline = d
	}
}

// renew sets the Lease's renewTime, and its duration to ttl when
// duration is set, with its UID as a precondition.
func (s *Session) renew(ctx context.Context, ttl time.Duration, duration bool) error {
	spec := map[string]any{"renewTime": metav1.NewMicroTime(s.clk.Now())}
	if duration {
		spec["leaseDurationSeconds"] = int32(ttl / time.Second)
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": s.uid}, "spec": spec})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, min(requestTimeout, ttl/2))
	defer cancel()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name}}
	return s.c.Patch(ctx, l, client.RawPatch(types.MergePatchType, body))
}

// lengthen renews the session now, in a renewal that also sets its Lease's
// duration to ttl when that is longer than the session's (never shorter),
// and returns once the renewal is confirmed: from then on the registry
// counts the session lapsed no earlier than fencing.SessionLapse(ttl)
// after that renewal was sent, and the session counts itself valid for
// sessionValidity(ttl) after it. Until then the session counts on its
// shorter duration, so a renewal whose reply is lost never makes it
// believe in more than the registry grants. It retries transient errors,
// and gives up when the session ends, the renewal is refused, or ctx ends.
func (s *Session) lengthen(ctx context.Context, ttl time.Duration) error {
	s.lengthening.Lock()
	defer s.lengthening.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	ttl = max(ttl, s.TTL())
	b := retryBackoff()
	for {
		sent := s.mono()
		err := s.renew(ctx, ttl, true)
		switch {
		case err == nil:
			s.confirm(sent, ttl)
			return s.Err()
		case apierrors.IsNotFound(err) || preconditionFailed(err):
			s.end(fmt.Errorf("%w: lease %s is gone", ErrSessionExpired, s.key))
			return s.Err()
		case !retryable(err):
			return fmt.Errorf("lock: lengthening session lease %s: %w", s.key, err)
		}
		select {
		case <-ctx.Done():
			if serr := s.Err(); serr != nil {
				return serr
			}
			return fmt.Errorf("lock: lengthening session lease %s: %w", s.key, errors.Join(context.Cause(ctx), err))
		case <-s.clk.After(b.Step()):
		}
	}
}

// Close stops renewing and deletes the Lease: the registry then withdraws
// the session's waiting requests and ends its grants at once. Release the
// handles first.
func (s *Session) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.stopped
	s.end(fmt.Errorf("%w: session closed", ErrReleased))
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name}}
	uid := s.uid
	if err := s.c.Delete(ctx, l, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !preconditionFailed(err) {
		return fmt.Errorf("lock: deleting session lease %s: %w", s.key, err)
	}
	return nil
}

// sessionSlot is a Client's own session, created on first use and replaced
// once lost.
type sessionSlot struct {
	mu     sync.Mutex
	s      *Session
	warned bool
	lost   []*Session
}

// sessionFor returns the session a request is made under, or nil for none.
func (c *Client) sessionFor(ctx context.Context, s *settings) (*Session, error) {
	switch {
	case s.session.none:
		return nil, nil
	case s.session.session != nil:
		if err := s.session.session.Err(); err != nil {
			return nil, err
		}
		return s.session.session, nil
	}
	slot := &c.sessions
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.s != nil && slot.s.Err() == nil {
		return slot.s, nil
	}
	sess, err := newSession(ctx, c.c, s.namespace, s.session.ttl, s.clk)
	if err != nil {
		if apierrors.IsForbidden(err) || runtime.IsNotRegisteredError(err) || apierrors.IsNotFound(err) {
			// Not allowed or not possible here: the request has no
			// liveness beyond its wait limit, as before sessions.
			if !slot.warned {
				slot.warned = true
				logf.FromContext(ctx).WithName("lock").Info("Requests are made without a session", "reason", err.Error())
			}
			return nil, nil
		}
		return nil, err
	}
	if slot.s != nil {
		slot.lost = append(slot.lost, slot.s)
	}
	slot.s = sess
	return sess, nil
}

// createUnder creates the request g under sess (nil: none). When admission
// says the Client's own session is gone (SESSION_EXPIRED: its Lease was
// deleted before the keeper noticed), it counts that session lost and
// creates the request once more under a new one. It returns the session
// the request was made under.
func (c *Client) createUnder(ctx context.Context, h *Handle, g *lockingv1alpha1.LockGrant, s *settings, sess *Session) (*Session, error) {
	if sess != nil {
		g.Spec.Session = sess.Ref()
	}
	err := h.create(ctx, g, s)
	r := Refusal(err)
	if sess == nil || s.session.session != nil || r == nil || r.Reason != fencing.ReasonSessionExpired {
		return sess, err
	}
	sess.end(fmt.Errorf("%w: %w", ErrSessionExpired, r))
	if sess, err = c.sessionFor(ctx, s); err != nil {
		return nil, err
	}
	g.Spec.Session = nil
	if sess != nil {
		g.Spec.Session = sess.Ref()
	}
	return sess, h.create(ctx, g, s)
}

// Close ends the Client's own session, if it has one (see Session.Close).
// Release the handles first: the registry ends the session's grants. The
// Client makes a new session on its next Acquire.
func (c *Client) Close(ctx context.Context) error {
	slot := &c.sessions
	slot.mu.Lock()
	all := append(slot.lost, slot.s)
	slot.s, slot.lost = nil, nil
	slot.mu.Unlock()
	var errs []error
	for _, s := range all {
		if s != nil {
			errs = append(errs, s.Close(ctx))
		}
	}
	return errors.Join(errs...)
}

// followSession spends the handle the moment its session no longer keeps
// it valid (sessionEnd): the session is lost, or its local deadline less
// the stop grace has passed. The registry ends the grant soon after, and
// the holder must have stopped first.
func (h *Handle) followSession() {
	s := h.sess
	armed := h.armed
	for h.sessionEnd() == nil {
		t := s.clk.NewTimer(s.validFor(h.sessionGrace()))
		select {
		case <-t.C():
		case <-s.Done():
		case <-armed:
			armed = nil // the stop grace counts from now on
		case <-h.stopped:
			t.Stop()
			return
		}
		t.Stop()
	}
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.spend(unknownBy(h.sessionEnd()))
	h.bump()
}

// armStopGrace makes the stop grace count against the handle's session
// from now on, once the grant is held. A request waits under the session
// as it is, short by default, so that a client that dies in the queue is
// skipped soon; the grant is held under a session long enough for the
// grace. When the session's duration does not leave room for the grace, or
// its last confirmed renewal no longer does, the session is lengthened
// (sessionTTLFor) in a renewal this call waits for.
func (h *Handle) armStopGrace(ctx context.Context) error {
	s := h.sess
	if s == nil || h.stopGrace == 0 {
		return nil
	}
	if !leaves(s.TTL(), h.stopGrace) || s.validFor(h.stopGrace) <= 0 {
		if err := s.lengthen(ctx, max(s.TTL(), sessionTTLFor(h.stopGrace))); err != nil {
			return err
		}
		h.log.V(1).Info("Session lengthened for the stop grace", "lease", s.key.String(), "ttl", s.TTL().String(), "stopGrace", h.stopGrace.String())
	}
	close(h.armed)
	if err := h.sessionEnd(); err != nil {
		return err
	}
	return nil
}

// sessionGrace is the stop grace that counts against the session now: 0
// until armStopGrace.
func (h *Handle) sessionGrace() time.Duration {
	select {
	case <-h.armed:
		return h.stopGrace
	default:
		return 0
	}
}

// sessionEnd returns why the handle's session no longer keeps it valid, or
// nil while it does (or it has none): the session was lost or closed, or no
// renewal of it was confirmed in time to leave the stop grace before its
// local deadline. The registry counts a session lapsed no earlier than
// fencing.SessionLapse(TTL) after the send of the last renewal it saw,
// sessionSafety(TTL) after that deadline.
func (h *Handle) sessionEnd() error {
	s := h.sess
	if s == nil {
		return nil
	}
	grace := h.sessionGrace()
	switch err := s.Err(); {
	case err != nil:
		return err
	case s.validFor(grace) > 0:
		return nil
	case grace > 0:
		return fmt.Errorf("%w: no renewal of lease %s was confirmed in time to leave the stop grace of %s", ErrSessionExpired, s.key, grace)
	}
	return fmt.Errorf("%w: no renewal of lease %s was confirmed in time", ErrSessionExpired, s.key)
}

// unknownBy is the cause of a handle spent because its session no longer
// keeps it valid (sessionEnd's err).
func unknownBy(err error) error {
	if errors.Is(err, ErrReleased) {
		return fmt.Errorf("%w: %w", ErrOwnershipUnknown, ErrSessionExpired)
	}
	return fmt.Errorf("%w: %w", ErrOwnershipUnknown, err)
}

// preconditionFailed reports whether a write was refused because its
// precondition (a resourceVersion or UID) no longer holds.
func preconditionFailed(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}
