package lock

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// Defaults of the options.
const (
	// DefaultNamespace is the namespace grants are made in without WithNamespace.
	DefaultNamespace = "default"
	// DefaultTTL is the lease duration without WithTTL: 30 seconds.
	DefaultTTL = 30 * time.Second
	// requestTimeout bounds each API request the library sends.
	requestTimeout = 10 * time.Second
	// withdrawTimeout bounds how long the library keeps trying, on a
	// context of its own, to end a request or grant its caller gave up on
	// (a cancelled Acquire, TryAcquire's busy answer, a Release whose
	// outcome was unknown when its context ended).
	withdrawTimeout = 10 * time.Second
	// tryWaitSeconds is the wait limit TryAcquire puts on its request, in
	// seconds: a backstop that ends the request in the registry even if the
	// withdrawal is lost.
	tryWaitSeconds = 5
	// waitSlack is how long past the wait limit Acquire waits for the
	// registry's TimedOut before withdrawing the request itself.
	waitSlack = 2 * time.Second
)

// Option configures a Client (defaults for every call) or one Acquire or
// TryAcquire call (overriding the Client's).
type Option func(*settings)

type settings struct {
	namespace      string
	ttl            time.Duration
	wait           time.Duration
	lockDelay      time.Duration
	permits        int32
	requestID      string
	operationRoot  string
	operationClass string
	policy         string
	margin         time.Duration
	stopGrace      time.Duration
	renewInterval  time.Duration
	clk            clock.WithTicker
	progress       func(*lockingv1alpha1.LockGrant)
	trace          func(TraceEvent)
	logger         *logr.Logger
	driver         string
	detached       bool
	// releaseByDelete: Release deletes the grant (WithReleaseByDelete).
	releaseByDelete bool
	annotations     map[string]string
	session         sessionSettings // session.go
	err             error
}

func newSettings(opts []Option) *settings {
	s := &settings{namespace: DefaultNamespace, ttl: DefaultTTL, clk: clock.RealClock{}}
	for _, o := range opts {
		o(s)
	}
	return s
}

func (s *settings) fail(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// WithNamespace makes grants in namespace ns. Resource IDs are scoped to a
// namespace. Default DefaultNamespace.
func WithNamespace(ns string) Option {
	return func(s *settings) {
		if ns == "" {
			s.fail("empty namespace")
		}
		s.namespace = ns
	}
}

// WithTTL sets the lease duration (spec.leaseDurationSeconds): whole
// seconds from 1 to 3600. Default DefaultTTL (30 s).
func WithTTL(d time.Duration) Option {
	return func(s *settings) {
		if d%time.Second != 0 || d < lockingv1alpha1.MinLeaseDurationSeconds*time.Second || d > lockingv1alpha1.MaxLeaseDurationSeconds*time.Second {
			s.fail("TTL %s is not a whole number of seconds from 1 to 3600", d)
		}
		s.ttl = d
	}
}

// WithWait limits how long Acquire waits in the resource's queue
// (spec.waitTimeoutSeconds, rounded up to whole seconds, at most one day).
// The registry ends a request whose limit passed as TimedOut and never
// grants it later. 0, the default, waits until ctx ends.
func WithWait(d time.Duration) Option {
	return func(s *settings) {
		if d < 0 || d > lockingv1alpha1.MaxWaitTimeoutSeconds*time.Second {
			s.fail("wait %s is not between 0 and 24h", d)
		}
		s.wait = d
	}
}

// WithLockDelay asks for a lock-delay (spec.lockDelaySeconds, rounded up to
// whole seconds, at most one hour): if this acquisition's lease ends without
// a release (it expired, its session lapsed, it was revoked or its grant was
// deleted), the resource is not granted to anyone else for d, so that
// effects still in flight on a resource that cannot check a fence can
// drain. A Release ends the grant without a delay. 0, the default, asks for
// none.
func WithLockDelay(d time.Duration) Option {
	return func(s *settings) {
		if d < 0 || d > lockingv1alpha1.MaxLockDelaySeconds*time.Second {
			s.fail("lock-delay %s is not between 0 and 1h", d)
		}
		s.lockDelay = d
	}
}

// WithPermits asks for one of n permits of the resource (spec.permits, 1
// to 64): a counted lock, or semaphore, that n holders may hold at once.
// The resource is then n exclusive slots sharing one FIFO queue; the grant
// holds one (Info.Permit), and each slot has its own fence sequence under
// its own fenced resource ID (Info.FencedResource): the resource ID itself
// for slot 0, the resource ID and "#k" for slot k. Every fencing rule of an
// exclusive lock holds per slot: guarded objects and store rows are bound to
// one slot, and Stamp and NextSegment name the handle's slot.
//
// The limit in force is the permits of the resource's most recently
// requested live grant, so every request for a resource should name the
// same n; a new n takes effect with the requests that name it, and
// lowering it never ends a live grant. 1, the default, is an exclusive lock,
// the same request as without the option.
func WithPermits(n int32) Option {
	return func(s *settings) {
		if n < 1 || n > lockingv1alpha1.MaxPermits {
			s.fail("permits %d is not from 1 to %d", n, lockingv1alpha1.MaxPermits)
		}
		s.permits = n
	}
}

// WithRequestID sets the request's idempotency key (1 to 63 letters,
// digits, ".", "_" or "-", starting and ending with a letter or digit). The
// grant is named after it (api/v1alpha1.GrantNameForRequest), so a create
// whose response was lost, retried with the same ID, finds the same grant
// and never queues twice. Without it, Acquire generates a random one.
//
// A request ID makes a retry of one attempt idempotent; it never lets a
// second live process hold the same grant. Each Acquire binds the grant to
// its driver token (WithDriverToken); another Acquire that finds the grant by its ID
// while it is Pending or Held gets an error matching
// fencing.ErrDriverMismatch, and one that finds it ended gets the reason it
// ended (fencing.ErrExpired, fencing.ErrAlreadyEnded, fencing.ErrRevoked):
// the ID is spent, use a new one for a new acquisition. It stays spent
// after the ended grant is deleted, for the registry's request-ID window
// (the manager's --request-id-window, 7 days by default; see
// docs/request-ids.md), and a cancelled Acquire spends it too. An Acquire
// past the window runs as a new attempt; the registry marks its grant and
// warns.
func WithRequestID(id string) Option {
	return func(s *settings) {
		if !lockingv1alpha1.ValidRequestID(id) {
			s.fail("request ID %q is not 1-63 letters, digits, '.', '_' or '-' starting and ending with a letter or digit", id)
		}
		s.requestID = id
	}
}

// WithOperationRoot binds the grant to one operation (spec.operationRoot,
// recorded in the signed grant record): the sha256 digest of the
// operation's description, as "sha256:" and 64 lowercase hex digits, the
// same for every retry of the operation. Segments (Handle.NextSegment)
// carry it, and enforcement points told the root of a write refuse a grant
// of another root. Default: "sha256:" + the hex SHA-256 of the request ID.
func WithOperationRoot(root string) Option {
	return func(s *settings) {
		if !lockingv1alpha1.ValidOperationRoot(root) {
			s.fail("operation root %q is not \"sha256:\" and 64 lowercase hex digits", root)
		}
		s.operationRoot = root
	}
}

// WithOperationClass names the kind of operation (spec.operationClass, e.g.
// "settlement"): up to 63 lowercase letters, digits and "-". Recorded in
// the grant record. Default: none.
func WithOperationClass(class string) Option {
	return func(s *settings) {
		if !lockingv1alpha1.ValidOperationClass(class) {
			s.fail("operation class %q is not up to 63 lowercase letters, digits and '-'", class)
		}
		s.operationClass = class
	}
}

// WithPolicy requests the grant under the GuardPolicy named policy
// (spec.policy): needed to write objects the policy covers. Admission
// refuses the request unless the policy lists the caller among its holders
// and allows the TTL. Default: none.
func WithPolicy(policy string) Option {
	return func(s *settings) {
		if policy == "" {
			s.fail("empty policy name")
		}
		s.policy = policy
	}
}

// WithSafetyMargin sets the margin subtracted from the local validity
// deadline (holder.Config.Margin). Default holder.DefaultMargin(TTL): a
// tenth of the TTL, at least 1 s, at most half the TTL.
func WithSafetyMargin(d time.Duration) Option {
	return func(s *settings) {
		if d < 0 {
			s.fail("negative safety margin %s", d)
		}
		s.margin = d
	}
}

// WithStopGrace makes the handle's Context end d before its local deadline
// instead of at it, for a holder that needs d to stop its effects once
// told to (kubectl lockwarden run's --grace, from SIGTERM to SIGKILL): work
// that stops within d of the Context's end has stopped by the deadline, so
// before the registry can end the grant, whether by its lease or by its
// session lapsing. Check counts to that earlier instant too.
//
// d comes out of the lease and out of the session. The lease must leave
// the handle time to renew before it: d must be less than TTL - margin -
// renew interval, or Acquire refuses it (ErrInvalidOption) before it makes
// the request. The session is lengthened when the grant is held, if it
// must be, so that it leaves two of its renewals before it (its duration
// then is about 4.3 x d, at least DefaultSessionTTL; Acquire returns once
// that renewal is confirmed): a request waits under the session as it is,
// and a grant is held under one long enough for d. The registry cannot
// tell a holder that died from one cut off whose work still has d to stop,
// so a longer d makes a dead holder's grant end later: about 4.3 x d + 1 s
// after its last session renewal, or at the end of its lease. Default 0.
func WithStopGrace(d time.Duration) Option {
	return func(s *settings) {
		if d < 0 {
			s.fail("negative stop grace %s", d)
		}
		s.stopGrace = d
	}
}

// leaseMargin is the margin the holder's state machine subtracts from a
// lease of ttl: the safety margin (0: holder's default) and, on top of it,
// the stop grace.
func (s *settings) leaseMargin(ttl time.Duration) time.Duration {
	if s.stopGrace == 0 {
		return s.margin
	}
	m := s.margin
	if m == 0 {
		m = holder.DefaultMargin(ttl)
	}
	return m + s.stopGrace
}

// WithRenewInterval sets how long after a confirmed send the next renew is
// sent (holder.Config.RenewInterval). Default holder.DefaultRenewInterval(TTL):
// a third of the TTL.
func WithRenewInterval(d time.Duration) Option {
	return func(s *settings) {
		if d < 0 {
			s.fail("negative renew interval %s", d)
		}
		s.renewInterval = d
	}
}

// WithClock sets the clock the handle measures monotonic time and sets its
// timers with. Only Since and timers are used, never the wall-clock
// reading. Default clock.RealClock. For tests.
func WithClock(clk clock.WithTicker) Option {
	return func(s *settings) { s.clk = clk }
}

// WithProgress calls fn with a copy of the grant each time the library sees
// it change while the request waits: its phase and status.queuePosition,
// which is the position the request joined the queue at, and 0 once it is
// next (it is not rewritten as requests ahead leave). fn runs on the
// library's goroutine and must return quickly.
func WithProgress(fn func(*lockingv1alpha1.LockGrant)) Option {
	return func(s *settings) { s.progress = fn }
}

var driverTokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)

// WithDriverToken sets the driver token the grant is bound to (annotation
// locking.lockwarden.io/driver): 16 to 128 letters, digits, "_" or "-".
// Only a Handle with this token renews and releases the grant; Acquire with
// the same request ID and token resumes the same attempt (for example a
// process that saved Handle.DriverToken before it restarted). Default: a random
// token for each Acquire, which no other process knows.
func WithDriverToken(token string) Option {
	return func(s *settings) {
		if !driverTokenRE.MatchString(token) {
			s.fail("driver token %q is not 16 to 128 letters, digits, '_' or '-'", token)
		}
		s.driver, s.detached = token, false
	}
}

// WithDetachedGrant makes a grant bound to no driver token: it outlives the
// process, any process of its owner may renew it (Client.Renew) and
// release it, and an Acquire with the same request ID finds it and follows
// it again. For grants held by hand (kubectl lockwarden acquire). The Handle
// still renews it while the program runs. Default: bound to a new driver token.
func WithDetachedGrant() Option {
	return func(s *settings) { s.driver, s.detached = "", true }
}

// WithReleaseByDelete makes Release end the acquisition by deleting its
// grant, instead of asking the registry to release it (spec.release): for
// callers that do not need the record of the release. The delete is
// conditional on the grant's UID and on the version the client last saw
// live (a grant that changed since is read again and judged first: one
// that already ended is refused with its reason, as a release is, and one
// another driver took over with fencing.ErrDriverMismatch). It is one API
// write fewer on the handoff's path, calls no admission webhook, and
// leaves nothing behind: no Released status, no grant for `kubectl
// lockwarden list` to show, no retention.
//
// What it gives up:
//   - The registry's verdict on a late release: a release the controller
//     finds past the lease end ends the grant Expired (Release returns
//     fencing.ErrExpired), while a delete that arrives before the
//     controller ended the grant is simply accepted and Release returns
//     nil. A holder that must know calls Check just before it releases.
//   - The lock-delay: the registry cannot tell its owner's delete from a
//     forced release, so a deleted holder counts as one that left without
//     a release and its lock-delay would hold the resource back at every
//     release. WithReleaseByDelete with WithLockDelay is refused
//     (ErrInvalidOption), and Client.Release with it refuses a grant that
//     has a lock-delay and keeps it.
//   - The request ID's spent window (docs/request-ids.md): the registry
//     records a request ID as spent when it ends and deletes a grant, not
//     when the grant's owner deletes it. WithReleaseByDelete with
//     WithRequestID is refused (ErrInvalidOption), as is Client.Release of
//     a grant made with one; with the generated request ID, which nobody
//     else knows, nothing is lost.
//
// Release returns once the resource's FenceCounter no longer names the
// grant (when the caller may watch FenceCounters), so that admission
// refuses writes under it from then on, as after a release. Default: off.
// See docs/grant-path.md, "Release by delete".
func WithReleaseByDelete() Option {
	return func(s *settings) { s.releaseByDelete = true }
}

// WithAnnotations puts extra annotations on the grant when it is created,
// for the requester's own bookkeeping (the elector of package election
// records its candidate's identity there). Keys in lockwarden's own
// domain (locking.lockwarden.io/) are refused: they carry the protocol.
// Default: none.
func WithAnnotations(ann map[string]string) Option {
	return func(s *settings) {
		for k := range ann {
			if strings.HasPrefix(k, lockingv1alpha1.GroupVersion.Group+"/") {
				s.fail("annotation %q is in lockwarden's own domain", k)
			}
		}
		s.annotations = ann
	}
}

// WithLogger sets the logger the library logs to (state changes at V(1),
// the end of ownership at V(0)). Default: the logger in the context given
// to Acquire (logr.FromContextOrDiscard), so a program that sets none
// prints nothing.
func WithLogger(l logr.Logger) Option {
	return func(s *settings) { s.logger = &l }
}

// requestTimeout bounds one API request of a handle with lease ttl: a
// quarter of the lease, between 1 s and 10 s, so that a request lost in a
// dead connection is sent again well before the local deadline.
func requestTimeoutFor(ttl time.Duration) time.Duration {
	return min(max(ttl/4, time.Second), requestTimeout)
}
