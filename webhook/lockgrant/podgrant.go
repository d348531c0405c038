package lockgrant

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// Grants requested by the manager on behalf of lock-gated Pods
// (docs/gated-workloads.md). Such a grant is owned by the Pod's
// ServiceAccount, not by its requester: admission keeps the Pod's place in
// the queue (its requested-at stamp) and names the requester as the
// grant's steward, which may renew and release it; the validator accepts
// it only from the manager and only for the gated Pod it names
// (fencing.CheckGrantCreate).

// stampRequest stamps a new grant with its admission facts: its place in
// the queue, its owner's groups, and its steward. A grant requested for
// another identity keeps the requested-at it carries (the validator
// requires that of its Pod), is stamped with the groups the API server
// gives the owner when it is a ServiceAccount, and names its requester as
// steward; every other grant is stamped with now and its requester's
// groups, and has no steward.
func stampRequest(g *lockingv1alpha1.LockGrant, user authenticationv1.UserInfo, now time.Time) {
	if g.Annotations == nil {
		g.Annotations = map[string]string{}
	}
	if g.Spec.Owner == user.Username {
		g.Annotations[lockingv1alpha1.RequestedAtAnnotation] = now.UTC().Format(time.RFC3339Nano)
		g.Annotations[lockingv1alpha1.OwnerGroupsAnnotation] = strings.Join(user.Groups, ",")
		delete(g.Annotations, lockingv1alpha1.StewardAnnotation)
		return
	}
	if _, err := time.Parse(time.RFC3339Nano, g.Annotations[lockingv1alpha1.RequestedAtAnnotation]); err != nil {
		g.Annotations[lockingv1alpha1.RequestedAtAnnotation] = now.UTC().Format(time.RFC3339Nano)
	}
	g.Annotations[lockingv1alpha1.OwnerGroupsAnnotation] = strings.Join(podgate.OwnerGroups(g.Spec.Owner), ",")
	g.Annotations[lockingv1alpha1.StewardAnnotation] = user.Username
}

// PodGrants lets the validator accept the grants the manager requests for
// lock-gated Pods.
type PodGrants struct {
	// Pods reads Pods directly from the API server.
	Pods client.Reader
	// Manager returns the identity the manager runs as.
	Manager func(context.Context) (string, error)
}

// WithPodGrants makes the validator accept grants the manager requests on
// behalf of the gated Pods they name, read with pods; manager returns the
// manager's identity. Without it, a grant is accepted only from its owner.
func WithPodGrants(pods client.Reader, manager func(context.Context) (string, error)) func(*Validator) {
	return func(v *Validator) { v.PodGrants = &PodGrants{Pods: pods, Manager: manager} }
}

// checkOwner refuses a grant whose owner is not its requester, unless the
// manager requests it for a gated Pod of that owner (fencing.CheckGrantCreate).
func (v *Validator) checkOwner(ctx context.Context, g *lockingv1alpha1.LockGrant, user string) error {
	c := fencing.GrantCreate{
		Requester: user, Owner: g.Spec.Owner, Namespace: g.Namespace, Resource: g.Spec.Resource,
		RequestID: g.Spec.RequestID, RequestedAt: g.Annotations[lockingv1alpha1.RequestedAtAnnotation],
		Pod: podgate.PodOf(g),
	}
	if v.PodGrants != nil && g.Spec.Owner != user {
		manager, err := v.PodGrants.Manager(ctx)
		if err != nil {
			return err
		}
		c.Manager = manager
		c.ReadPod = func() (*fencing.BoundPod, error) {
			pod := &corev1.Pod{}
			switch err := v.PodGrants.Pods.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: c.Pod.Name}, pod); {
			case apierrors.IsNotFound(err):
				return nil, nil
			case err != nil:
				return nil, fmt.Errorf("reading Pod %s/%s: %w", g.Namespace, c.Pod.Name, err)
			}
			return podgate.BoundPodOf(pod), nil
		}
		c.MayAcquire = func() (bool, error) {
			return facts.MayAcquire(ctx, v.Authorizer, g.Namespace, g.Spec.Owner, podgate.OwnerGroups(g.Spec.Owner))
		}
	}
	return fencing.CheckGrantCreate(c)
}

// SelfIdentity returns a function that asks the API server who cfg
// authenticates as (a SelfSubjectReview), once it has answered: the
// manager's own identity, which stewards the grants of gated Pods.
func SelfIdentity(cfg *rest.Config) (func(context.Context) (string, error), error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("creating a client to learn the manager's identity: %w", err)
	}
	var (
		mu   sync.Mutex
		name string
	)
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if name != "" {
			return name, nil
		}
		r := &authenticationv1.SelfSubjectReview{}
		if err := c.Create(ctx, r); err != nil {
			return "", fmt.Errorf("asking the API server who the manager is: %w", err)
		}
		name = r.Status.UserInfo.Username
		return name, nil
	}, nil
}
