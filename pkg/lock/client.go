package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// Client acquires locks (LockGrants) for one identity: the user the
// Kubernetes client authenticates as is the owner of every grant it makes.
type Client struct {
	c        client.WithWatch
	defaults []Option
	sessions sessionSlot // session.go
}

// NewClient returns a Client that talks to the API server through c, with
// opts as the defaults of every Acquire and TryAcquire. c must read directly
// from the API server (client.NewWithWatch), never from an informer cache:
// ownership decisions need current reads. The scheme of c must include
// api/v1alpha1 (lockingv1alpha1.AddToScheme).
func NewClient(c client.WithWatch, opts ...Option) *Client {
	return &Client{c: c, defaults: opts}
}

// settings returns the client's defaults overridden by opts.
func (c *Client) settings(opts []Option) *settings {
	return newSettings(append(append([]Option{}, c.defaults...), opts...))
}

// Namespace returns the namespace the client makes grants in by default.
func (c *Client) Namespace() string { return c.settings(nil).namespace }

// newRequestID returns a random request ID: "lw-" and 24 hex digits.
func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "lw-" + hex.EncodeToString(b)
}

// target is one acquisition a request acts on: the grant's name, its UID
// (a precondition: the request never reaches a later grant that reuses the
// name) and, for a Handle's requests, its driver token (a precondition
// too: another driver's requests are refused).
type target struct {
	key     types.NamespacedName
	uid     types.UID
	driver  string
	timeout time.Duration
}

// patchSpec sets spec.field to value on exactly the acquisition t, with a
// JSON patch whose test operations are t's UID and driver token. A failed test
// is answered from a fresh read: errGone when the name belongs to no grant
// or another acquisition, a DRIVER_MISMATCH refusal when the grant is
// bound to another driver. Refusals by admission come back wrapped so
// that they match their fencing sentinels.
func (c *Client) patchSpec(ctx context.Context, t target, field string, value any) (*lockingv1alpha1.LockGrant, error) {
	ops := []map[string]any{{"op": "test", "path": "/metadata/uid", "value": t.uid}}
	if t.driver != "" {
		ops = append(ops, map[string]any{"op": "test", "path": "/metadata/annotations/" + strings.ReplaceAll(lockingv1alpha1.DriverAnnotation, "/", "~1"), "value": t.driver})
	}
	ops = append(ops, map[string]any{"op": "add", "path": "/spec/" + field, "value": value})
	body, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: t.key.Namespace, Name: t.key.Name}}
	rctx, cancel := context.WithTimeout(ctx, t.timeout)
	err = c.c.Patch(rctx, g, client.RawPatch(types.JSONPatchType, body))
	cancel()
	switch {
	case err == nil:
		return g, nil
	case isGone(err):
		return nil, errGone
	case testFailed(err):
		cur, gerr := c.get(ctx, t.key)
		switch {
		case gerr != nil:
			return nil, err // outcome unknown: no fact to decide on
		case cur == nil:
			return nil, errGone
		case cur.UID != t.uid:
			return nil, &nameTaken{uid: cur.UID}
		case t.driver != "" && cur.Annotations[lockingv1alpha1.DriverAnnotation] != t.driver:
			return nil, driverMismatch(cur)
		}
		return nil, err
	}
	return nil, denial.Wrap(err)
}

// get reads a grant; nil, nil when it does not exist.
func (c *Client) get(ctx context.Context, key types.NamespacedName) (*lockingv1alpha1.LockGrant, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	g := &lockingv1alpha1.LockGrant{}
	if err := c.c.Get(ctx, key, g); err != nil {
		if isGone(err) {
			return nil, nil
		}
		return nil, err
	}
	return g, nil
}

// retryBackoff is the pause between attempts of a request whose outcome is
// unknown: 100 ms doubling to 2 s, with 20% jitter, on the injected clock.
func retryBackoff() wait.Backoff {
	return wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 2 * time.Second}
}

// gone is the refusal for acquisition uid of grant key, which does not
// exist (any more); err, when it says so (nameTaken), names the later
// acquisition that has the name now. uid "" speaks of the grant.
func gone(key types.NamespacedName, uid types.UID, err error) *fencing.Error {
	var taken *nameTaken
	switch {
	case errors.As(err, &taken) && uid != "":
		return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: fmt.Sprintf(
			"acquisition %s of grant %s does not exist: the name belongs to another acquisition (%s), which this request does not touch",
			uid, key, taken.uid)}
	case errors.As(err, &taken):
		return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: fmt.Sprintf(
			"grant %s is another acquisition now (%s)", key, taken.uid)}
	case uid != "":
		return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: fmt.Sprintf("acquisition %s of grant %s does not exist: it ended and was deleted, or never existed", uid, key)}
	}
	return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: fmt.Sprintf("grant %s does not exist: it ended and was deleted, or never existed", key)}
}

// goneFrom is gone for acquisition uid of key as read (cur, nil when the
// name belongs to no grant).
func goneFrom(key types.NamespacedName, uid types.UID, cur *lockingv1alpha1.LockGrant) *fencing.Error {
	if cur == nil {
		return gone(key, uid, errGone)
	}
	return gone(key, uid, &nameTaken{uid: cur.UID})
}

// Release releases exactly the acquisition uid of grant key (a Pending
// request is withdrawn, a Held grant released), by setting spec.release with
// the UID as a precondition, and waits (watching) until the controller has
// ended the grant, so that once it returns nil the guarded-write webhook
// refuses writes under the grant. uid is required: read the grant first to
// release whatever grant has the name now.
//
// It returns nil when the release was accepted, and otherwise an error
// that matches the refusal's fencing sentinel with errors.Is (as etcd's
// concurrency.ErrLockReleased): fencing.ErrExpired (the lease had run out
// first: whatever was done after the expiry was not protected),
// fencing.ErrAlreadyEnded (released before, or timed out in the queue),
// fencing.ErrNotOwner, fencing.ErrRevoked, fencing.ErrUnknownGrant (no such
// acquisition: deleted, or never made). Requests whose outcome is unknown
// are retried, with jittered backoff, until ctx ends; when a retry is refused
// it reads the grant to tell whether its own earlier attempt was the one
// that released it. An error matching none of the sentinels means no
// definite answer was obtained (ctx ended, or the API server refused the
// request itself, e.g. RBAC).
//
// A release aimed at an earlier acquisition can never end a later one.
// Releasing a grant a Handle drives from elsewhere is allowed (it is how a
// stuck holder is stopped); the Handle then ends with ErrLost.
//
// With WithReleaseByDelete (among the client's defaults or in opts), it
// deletes the grant instead, as Handle.Release then does.
func (c *Client) Release(ctx context.Context, key types.NamespacedName, uid types.UID, opts ...Option) error {
	if uid == "" {
		return fmt.Errorf("%w: Release needs the grant's UID", ErrInvalidOption)
	}
	s := c.settings(opts)
	if s.err != nil {
		return s.err
	}
	t := target{key: key, uid: uid, timeout: requestTimeout}
	if s.releaseByDelete {
		return c.releaseByDelete(ctx, s.clk, t, nil, false)
	}
	return c.release(ctx, s.clk, t, false)
}

// releaseByDelete releases acquisition t by deleting its grant, conditional
// on its UID and on the version of a read that showed it live (seen, when
// set and of this acquisition, else a fresh read): a grant that ended, asked
// to be released, or is driven by another driver is refused with its
// reason and not deleted; one that changed since the read is read again.
// ambiguous: an earlier attempt's outcome is unknown, so a grant found gone
// was most likely deleted by it. After the delete it waits until the
// resource's counter no longer names the grant (awaitCounterFreed).
func (c *Client) releaseByDelete(ctx context.Context, clk clock.WithTicker, t target, seen *lockingv1alpha1.LockGrant, ambiguous bool) error {
	b := retryBackoff()
	cur := seen
	if cur != nil && cur.UID != t.uid {
		cur = nil
	}
	last := cur // the last live version read: whether it held, and where
	for {
		if cur == nil {
			g, err := c.get(ctx, t.key)
			switch {
			case err != nil && !retryable(err):
				return fmt.Errorf("lock: releasing grant %s: %w", t.key, err)
			case err != nil:
				ambiguous = true
			case g == nil || g.UID != t.uid:
				if ambiguous && last != nil {
					// Most likely deleted by the earlier attempt.
					return c.awaitCounterFreed(ctx, clk, t, last)
				}
				if ambiguous {
					return nil
				}
				return fmt.Errorf("lock: releasing grant %s: %w", t.key, goneFrom(t.key, t.uid, g))
			default:
				cur, last = g, g
			}
		}
		if cur != nil {
			if r := deleteRefusal(cur, t); r != nil {
				return fmt.Errorf("lock: releasing grant %s: %w", t.key, r)
			}
			if err := deletable(cur); err != nil {
				return fmt.Errorf("lock: releasing grant %s: %w", t.key, err)
			}
			uid, rv := t.uid, cur.ResourceVersion
			g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: t.key.Namespace, Name: t.key.Name}}
			rctx, cancel := context.WithTimeout(ctx, t.timeout)
			err := c.c.Delete(rctx, g, client.Preconditions{UID: &uid, ResourceVersion: &rv})
			cancel()
			switch {
			case err == nil:
				return c.awaitCounterFreed(ctx, clk, t, cur)
			case apierrors.IsConflict(err):
				cur = nil // changed since the read: judge it again
				continue
			case isGone(err):
				cur = nil
				continue
			case Refusal(err) != nil:
				return fmt.Errorf("lock: releasing grant %s: %w", t.key, denial.Wrap(err))
			case !retryable(err):
				return fmt.Errorf("lock: releasing grant %s: %w", t.key, err)
			}
			ambiguous, cur = true, nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock: releasing grant %s, outcome unknown: %w", t.key, ctx.Err())
		case <-clk.After(b.Step()):
		}
	}
}

// deleteRefusal is why acquisition t's grant g, as read, may not be
// released by deleting it: it is driven by another driver, it ended, or
// its owner asked to release it already (ALREADY_ENDED); nil when it is
// live.
func deleteRefusal(g *lockingv1alpha1.LockGrant, t target) *fencing.Error {
	if t.driver != "" && g.Annotations[lockingv1alpha1.DriverAnnotation] != t.driver {
		return driverMismatch(g)
	}
	switch g.Status.Phase {
	case lockingv1alpha1.PhaseExpired:
		return &fencing.Error{Reason: fencing.ReasonExpired, Detail: "the grant has already expired"}
	case lockingv1alpha1.PhaseRevoked:
		return &fencing.Error{Reason: fencing.ReasonRevoked, Detail: "the issuer revoked the grant"}
	case lockingv1alpha1.PhaseReleased, lockingv1alpha1.PhaseTimedOut:
		return &fencing.Error{Reason: fencing.ReasonAlreadyEnded, Detail: "the grant has already ended"}
	}
	if g.Spec.Release {
		return &fencing.Error{Reason: fencing.ReasonAlreadyEnded, Detail: "the grant's release was asked for already"}
	}
	return nil
}

// deletable refuses (ErrInvalidOption) to release grant g by deleting it
// when that would lose what its owner asked for when it acquired: a
// lock-delay (a deleted holder counts as one that left without a release,
// so the delay would hold the resource back) or a request ID of its own
// (recorded as spent only when the registry ends and deletes the grant).
// Such a grant is released with spec.release (Release without
// WithReleaseByDelete).
func deletable(g *lockingv1alpha1.LockGrant) error {
	switch {
	case g.Spec.LockDelaySeconds > 0:
		return fmt.Errorf("%w: release by delete of a grant with a lock-delay (%ds): a deleted holder counts as one that left without a release", ErrInvalidOption, g.Spec.LockDelaySeconds)
	case g.Spec.RequestID != "" && g.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] != "true":
		return fmt.Errorf("%w: release by delete of a grant made with request ID %q: the ID is recorded as spent only when the registry ends the grant", ErrInvalidOption, g.Spec.RequestID)
	}
	return nil
}

// awaitCounterFreed waits, watching, until the FenceCounter of deleted grant
// g no longer names it: from then on admission refuses writes under it. It
// returns nil at once when the grant was not the holder of record (a
// waiting request), when the caller may not watch FenceCounters, and when
// ctx ends first: a delete cannot be undone.
func (c *Client) awaitCounterFreed(ctx context.Context, clk clock.WithTicker, t target, g *lockingv1alpha1.LockGrant) error {
	if g.Status.Phase != lockingv1alpha1.PhaseHeld && g.Status.Phase != "" && g.Status.Phase != lockingv1alpha1.PhasePending {
		return nil
	}
	key := types.NamespacedName{Namespace: t.key.Namespace, Name: lockingv1alpha1.FenceCounterName(g.HeldFencedResource())}
	_ = watchCounter(ctx, c.c, clk, key, func(fc *lockingv1alpha1.FenceCounter) (bool, error) {
		return fc == nil || fc.Spec.Holder == nil || fc.Spec.Holder.UID != string(t.uid), nil
	})
	return nil
}

// release is Release of t. ambiguous: an earlier attempt's outcome is
// unknown, so an ALREADY_ENDED or EXPIRED answer may be that attempt's
// success.
func (c *Client) release(ctx context.Context, clk clock.WithTicker, t target, ambiguous bool) error {
	b := retryBackoff()
	for {
		_, err := c.patchSpec(ctx, t, "release", true)
		if err == nil {
			return c.releaseOutcome(ctx, clk, t)
		}
		if errors.Is(err, errGone) {
			return fmt.Errorf("lock: releasing grant %s: %w", t.key, gone(t.key, t.uid, err))
		}
		if r := Refusal(err); r != nil {
			if ambiguous && (r.Reason == fencing.ReasonAlreadyEnded || r.Reason == fencing.ReasonExpired) {
				// Our earlier attempt may have been the one that landed.
				if g, gerr := c.get(ctx, t.key); gerr == nil && g != nil && g.UID == t.uid && g.Spec.Release && g.Status.Phase == lockingv1alpha1.PhaseReleased {
					return nil
				}
			}
			return fmt.Errorf("lock: releasing grant %s: %w", t.key, err)
		}
		if !retryable(err) && !testFailed(err) {
			return fmt.Errorf("lock: releasing grant %s: %w", t.key, err)
		}
		ambiguous = true
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock: releasing grant %s, outcome unknown: %w", t.key, errors.Join(ctx.Err(), err))
		case <-clk.After(b.Step()):
		}
	}
}

// releaseOutcome waits, watching, until the controller has ended the grant
// whose release the API server accepted: nil, or an EXPIRED refusal when the
// controller found the lease already over. When ctx ends first the answer is
// nil: an accepted release cannot be undone.
func (c *Client) releaseOutcome(ctx context.Context, clk clock.WithTicker, t target) error {
	g, err := waitForGrant(ctx, c.c, clk, t.key, func(g *lockingv1alpha1.LockGrant) bool {
		return g == nil || g.UID != t.uid || g.Status.Phase.Final()
	})
	if err == nil && g != nil && g.UID == t.uid && g.Status.Phase == lockingv1alpha1.PhaseExpired {
		return fmt.Errorf("lock: releasing grant %s: %w", t.key, &fencing.Error{Reason: fencing.ReasonExpired,
			Detail: "the lease had expired when the controller processed the release"})
	}
	return nil
}

// Renew renews exactly the acquisition uid of grant key once: it raises
// spec.renewals by one (UID precondition), then waits, watching the grant,
// until the controller answered, and returns the grant as the controller
// left it. uid is required. Requests whose outcome is unknown are retried
// with the same renewals value, with jittered backoff, so a renew is never
// applied twice.
//
// Refusals match their fencing sentinel with errors.Is, as Release's do:
// fencing.ErrExpired (the lease had run out: a renew never re-acquires),
// fencing.ErrNotOwner, fencing.ErrAlreadyEnded, fencing.ErrNotHeld (still
// queued), fencing.ErrRevoked, fencing.ErrUnknownGrant (no such
// acquisition), fencing.ErrDriverMismatch (a Handle, such as kubectl lock
// run's, drives this grant and renews it itself). Other errors mean no
// definite answer came (ctx ended, or the API server refused the request
// itself).
//
// Renew is for grants without a Handle (WithDetachedGrant, kubectl lock
// acquire).
func (c *Client) Renew(ctx context.Context, key types.NamespacedName, uid types.UID) (*lockingv1alpha1.LockGrant, error) {
	if uid == "" {
		return nil, fmt.Errorf("%w: Renew needs the grant's UID", ErrInvalidOption)
	}
	clk := c.settings(nil).clk
	cur, err := c.get(ctx, key)
	switch {
	case err != nil:
		return nil, fmt.Errorf("lock: reading grant %s: %w", key, err)
	case cur == nil || cur.UID != uid:
		return nil, fmt.Errorf("lock: renewing grant %s: %w", key, goneFrom(key, uid, cur))
	case cur.Annotations[lockingv1alpha1.DriverAnnotation] != "":
		return nil, fmt.Errorf("lock: renewing grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonDriverMismatch, Detail: fmt.Sprintf(
			"grant %s is driven by a running holder (kubectl lockwarden run or a library Handle), which renews it itself", key.Name)})
	}
	t := target{key: key, uid: uid, timeout: requestTimeout}
	want := cur.Spec.Renewals + 1
	b := retryBackoff()
	for {
		_, err := c.patchSpec(ctx, t, "renewals", want)
		if err == nil {
			break
		}
		if errors.Is(err, errGone) {
			return nil, fmt.Errorf("lock: renewing grant %s: %w", key, gone(key, uid, err))
		}
		if Refusal(err) != nil || (!retryable(err) && !testFailed(err)) {
			return nil, fmt.Errorf("lock: renewing grant %s: %w", key, err)
		}
		g, gerr := c.get(ctx, key)
		if gerr == nil && (g == nil || g.UID != uid) {
			return nil, fmt.Errorf("lock: renewing grant %s: %w", key, goneFrom(key, uid, g))
		}
		if gerr == nil && g.Spec.Renewals >= want {
			break // applied; the reply was lost
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock: renewing grant %s, outcome unknown: %w", key, errors.Join(ctx.Err(), err))
		case <-clk.After(b.Step()):
		}
	}
	g, err := waitForGrant(ctx, c.c, clk, key, func(g *lockingv1alpha1.LockGrant) bool {
		return g == nil || g.UID != uid || g.Status.ObservedRenewals >= want || g.Status.Phase.Final()
	})
	switch {
	case err != nil:
		return nil, err
	case g == nil || g.UID != uid:
		return nil, fmt.Errorf("lock: renewing grant %s: %w", key, goneFrom(key, uid, g))
	case g.Status.Phase == lockingv1alpha1.PhaseHeld:
		return g, nil
	case g.Status.Phase == lockingv1alpha1.PhaseExpired:
		return g, fmt.Errorf("lock: renewing grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonExpired, Detail: "the lease had expired when the controller saw the renew; acquire again for a new fence"})
	case g.Status.Phase == lockingv1alpha1.PhaseRevoked:
		return g, fmt.Errorf("lock: renewing grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonRevoked, Detail: "the issuer revoked the grant"})
	}
	return g, fmt.Errorf("lock: renewing grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonAlreadyEnded, Detail: "the grant is " + string(g.Status.Phase)})
}
