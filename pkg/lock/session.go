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
// client died is withdrawn at most DefaultSessionTTL + fencing.SessionMargin
// (6 s) after the client's last renewal.
const DefaultSessionTTL = 5 * time.Second

// ErrSessionExpired means the client's session could not be renewed before its
// local deadline, or its Lease is gone. The registry withdraws the
// session's requests and ends its grants; handles made under it are spent
// (their Err wraps ErrOwnershipUnknown and ErrSessionExpired).
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
// The registry counts a session lapsed TTL + fencing.SessionMargin after it
// last saw the Lease change, by its own clock. The session counts itself
// valid until TTL minus a margin (a tenth of TTL, at least 500 ms) after it
// sent its last renewal that was accepted, on the local monotonic clock, and
// spends every handle made under it at that instant: a paused process stops
// producing effects before the registry drops it, whatever its wall clock
// says.
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
	ttl    time.Duration

	mu       sync.Mutex
	deadline time.Duration // since origin, on the monotonic clock
	cause    error
	done     chan struct{}

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
	if err := retrying(ctx, func(rctx context.Context) error { return c.Create(rctx, review) }); err != nil {
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
	if err := retrying(ctx, func(rctx context.Context) error {
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
	s.deadline = sent + s.validity()
	go s.keep(logf.FromContext(ctx).WithName("lock-session"))
	return s, nil
}

// retrying calls fn with a per-request timeout, again after a pause while
// its error is transient, until it succeeds, fails for good or ctx ends.
func retrying(ctx context.Context, fn func(context.Context) error) error {
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
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// validity is how long after a renewal is sent the session counts itself
// valid: TTL minus a tenth of it, at least 500 ms less.
func (s *Session) validity() time.Duration {
	return s.ttl - max(s.ttl/10, 500*time.Millisecond)
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
	interval := s.ttl / 3
	next := s.clk.NewTimer(interval)
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
		sent := s.mono()
		err := s.renew()
		switch {
		case err == nil:
			s.mu.Lock()
			if d := sent + s.validity(); d > s.deadline && sent < s.deadline {
				s.deadline = d
			}
			s.mu.Unlock()
			next.Reset(interval)
		case apierrors.IsNotFound(err) || preconditionFailed(err):
			s.end(fmt.Errorf("%w: lease %s is gone", ErrSessionExpired, s.key))
			log.Info("Session lost", "lease", s.key.String(), "error", err.Error())
			return
		default:
			next.Reset(min(interval, max(s.ttl/10, 200*time.Millisecond)))
		}
	}
}

// renew sets the Lease's renewTime, with its UID as a precondition.
func (s *Session) renew() error {
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": s.uid},
		"spec":     map[string]any{"renewTime": metav1.NewMicroTime(s.clk.Now())},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(requestTimeout, s.ttl/2))
	defer cancel()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name}}
	return s.c.Patch(ctx, l, client.RawPatch(types.MergePatchType, body))
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

// followSession spends the handle the moment its session is lost: the
// registry ends the grant soon after, and the holder must stop first.
func (h *Handle) followSession(s *Session) {
	select {
	case <-s.Done():
	case <-h.stopped:
		return
	}
	err := s.Err()
	if errors.Is(err, ErrReleased) {
		err = fmt.Errorf("%w: %w", ErrOwnershipUnknown, ErrSessionExpired)
	} else {
		err = fmt.Errorf("%w: %w", ErrOwnershipUnknown, err)
	}
	defer h.flushTrace()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.spend(err)
	h.bump()
}

// preconditionFailed reports whether a write was refused because its
// precondition (a resourceVersion or UID) no longer holds.
func preconditionFailed(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}
