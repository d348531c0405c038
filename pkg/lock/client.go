package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

var (
	requestIDRE      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
	operationRootRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	operationClassRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
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

// patchGrant sends a merge patch of spec for exactly the acquisition uid:
// the UID in the patch is a precondition, so it can never reach a later
// grant that reuses the name.
func (c *Client) patchGrant(ctx context.Context, key types.NamespacedName, uid types.UID, spec map[string]any) (*lockingv1alpha1.LockGrant, error) {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid}, "spec": spec})
	if err != nil {
		return nil, err
	}
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := c.c.Patch(ctx, g, client.RawPatch(types.MergePatchType, body)); err != nil {
		return nil, err
	}
	return g, nil
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

// preconditionFailed reports whether err is the API server refusing a
// patch whose metadata.uid differs from the stored object's: the name now
// belongs to another acquisition.
func preconditionFailed(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}

// ReleaseResult is the registry's answer to a release.
type ReleaseResult string

const (
	// Released: the release was accepted and the controller ended the grant
	// (or had not answered yet when the caller's context ended); the
	// resource passes to the next waiter.
	Released ReleaseResult = "Released"
	// LeaseExpired: the lease had already run out (admission said EXPIRED):
	// whatever was done after the expiry was not protected by this grant.
	LeaseExpired ReleaseResult = "Expired"
	// AlreadyEnded: the acquisition had already ended (released before,
	// timed out in the queue, or deleted), so the release changed nothing.
	AlreadyEnded ReleaseResult = "AlreadyEnded"
	// NotOwner: the caller is not the grant's owner; nothing changed.
	NotOwner ReleaseResult = "NotOwner"
)

// Reason returns the fencing reason code of a refusal result, "" for Released.
func (r ReleaseResult) Reason() fencing.Reason {
	switch r {
	case LeaseExpired:
		return fencing.ReasonExpired
	case AlreadyEnded:
		return fencing.ReasonAlreadyEnded
	case NotOwner:
		return fencing.ReasonNotOwner
	}
	return ""
}

// Release releases exactly the acquisition uid of grant key (a Pending
// request is withdrawn, a Held grant released), by setting spec.release with
// the UID as a precondition, and waits (watching) until the controller has
// ended the grant, so that once it returns Released the guarded-write
// webhook refuses writes under the grant. An empty uid means the grant that
// has this name now (read first). It retries requests whose outcome is unknown until
// ctx ends, and when a retry is refused it reads the grant to tell whether
// its own earlier attempt was the one that released it. It returns an error
// only when no definite answer was obtained.
//
// Field cases C03 and C09: a release aimed at an earlier acquisition can
// never end a later one; it returns AlreadyEnded or LeaseExpired.
func (c *Client) Release(ctx context.Context, key types.NamespacedName, uid types.UID) (ReleaseResult, error) {
	if uid == "" {
		g, err := c.get(ctx, key)
		switch {
		case err != nil:
			return "", fmt.Errorf("lock: reading grant %s: %w", key, err)
		case g == nil:
			return AlreadyEnded, nil
		}
		uid = g.UID
	}
	ambiguous := false
	for {
		_, err := c.patchGrant(ctx, key, uid, map[string]any{"release": true})
		if err == nil {
			return c.releaseOutcome(ctx, key, uid), nil
		}
		if r := Refusal(err); r != nil {
			if ambiguous && (r.Reason == fencing.ReasonAlreadyEnded || r.Reason == fencing.ReasonExpired) {
				// Our earlier attempt may have been the one that landed.
				if g, gerr := c.get(ctx, key); gerr == nil && g != nil && g.UID == uid && g.Spec.Release && g.Status.Phase == lockingv1alpha1.PhaseReleased {
					return Released, nil
				}
			}
			switch r.Reason {
			case fencing.ReasonExpired:
				return LeaseExpired, nil
			case fencing.ReasonNotOwner:
				return NotOwner, nil
			case fencing.ReasonAlreadyEnded:
				return AlreadyEnded, nil
			}
			return "", fmt.Errorf("lock: releasing grant %s: %w", key, r)
		}
		if isGone(err) {
			return AlreadyEnded, nil
		}
		if preconditionFailed(err) {
			g, gerr := c.get(ctx, key)
			if gerr == nil && (g == nil || g.UID != uid) {
				return AlreadyEnded, nil // the name belongs to another acquisition
			}
		}
		ambiguous = true
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("lock: releasing grant %s, outcome unknown: %w", key, errors.Join(ctx.Err(), err))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// releaseOutcome waits, watching, until the controller has ended the grant
// whose release the API server accepted: Released, or LeaseExpired when the
// controller found the lease already over. When ctx ends first the answer is
// Released: an accepted release cannot be undone.
func (c *Client) releaseOutcome(ctx context.Context, key types.NamespacedName, uid types.UID) ReleaseResult {
	g, err := WaitForGrant(ctx, c.c, key, func(g *lockingv1alpha1.LockGrant) bool {
		return g == nil || g.UID != uid || g.Status.Phase.Final()
	})
	if err == nil && g != nil && g.UID == uid && g.Status.Phase == lockingv1alpha1.PhaseExpired {
		return LeaseExpired
	}
	return Released
}

// Renew renews exactly the acquisition uid of grant key once: it raises
// spec.renewals by one (UID precondition), then waits, watching the grant,
// until the controller answered, and returns the grant as the controller
// left it. An empty uid means the grant that has this name now. Requests
// whose outcome is unknown are retried with the same renewals value, so a
// renew is never applied twice (C10).
//
// Errors: a *fencing.Error (errors.Is with fencing.ErrExpired,
// fencing.ErrNotOwner, fencing.ErrAlreadyEnded, fencing.ErrNotHeld) when the
// registry refused the renew or answered that the lease had already expired
// (C08: a renew never re-acquires); ErrLost when the acquisition no longer
// exists; ctx's error when no answer came in time.
//
// Renew is for grants without a Handle (kubectl lock renew). A Handle renews
// itself; renewing its grant from elsewhere as well weakens its local
// deadline (see package holder).
func (c *Client) Renew(ctx context.Context, key types.NamespacedName, uid types.UID) (*lockingv1alpha1.LockGrant, error) {
	cur, err := c.get(ctx, key)
	switch {
	case err != nil:
		return nil, fmt.Errorf("lock: reading grant %s: %w", key, err)
	case cur == nil || (uid != "" && cur.UID != uid):
		return nil, fmt.Errorf("%w: grant %s does not exist any more", ErrLost, key)
	}
	uid = cur.UID
	target := cur.Spec.Renewals + 1
	for {
		_, err := c.patchGrant(ctx, key, uid, map[string]any{"renewals": target})
		if err == nil {
			break
		}
		if r := Refusal(err); r != nil {
			return nil, fmt.Errorf("lock: renewing grant %s: %w", key, r)
		}
		if isGone(err) {
			return nil, fmt.Errorf("%w: grant %s does not exist any more", ErrLost, key)
		}
		g, gerr := c.get(ctx, key)
		if gerr == nil && (g == nil || g.UID != uid) {
			return nil, fmt.Errorf("%w: grant %s does not exist any more", ErrLost, key)
		}
		if gerr == nil && g.Spec.Renewals >= target {
			break // applied; the reply was lost
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock: renewing grant %s, outcome unknown: %w", key, errors.Join(ctx.Err(), err))
		case <-time.After(200 * time.Millisecond):
		}
	}
	g, err := WaitForGrant(ctx, c.c, key, func(g *lockingv1alpha1.LockGrant) bool {
		return g == nil || g.UID != uid || g.Status.ObservedRenewals >= target || g.Status.Phase.Final()
	})
	switch {
	case err != nil:
		return nil, err
	case g == nil || g.UID != uid:
		return nil, fmt.Errorf("%w: grant %s does not exist any more", ErrLost, key)
	case g.Status.Phase == lockingv1alpha1.PhaseHeld:
		return g, nil
	case g.Status.Phase == lockingv1alpha1.PhaseExpired:
		return g, fmt.Errorf("lock: renewing grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonExpired, Detail: "the lease had expired when the controller saw the renew; acquire again for a new fence"})
	}
	return g, fmt.Errorf("lock: renewing grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonAlreadyEnded, Detail: "the grant is " + string(g.Status.Phase)})
}
