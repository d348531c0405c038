package main

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// grantRegistry answers the store's registry reads for this worker's own
// grant, with direct GETs of the LockGrant and its FenceCounter from the
// API server (a quorum read, never a cache).
type grantRegistry struct {
	reader client.Reader
	grant  types.NamespacedName
}

var _ postgres.Registry = grantRegistry{}

// GrantFacts implements postgres.Registry: the worker's grant when it is
// the one asked for and lives in the asked namespace, and the FenceCounter
// of the resource in that namespace.
func (r grantRegistry) GrantFacts(ctx context.Context, k postgres.Key, grantUID string) (*fencing.Grant, *fencing.Counter, error) {
	g := &lockingv1alpha1.LockGrant{}
	if k.Namespace != r.grant.Namespace {
		g = nil // only grants of the segment's own namespace count
	} else {
		switch err := r.reader.Get(ctx, r.grant, g); {
		case apierrors.IsNotFound(err):
			g = nil
		case err != nil:
			return nil, nil, fmt.Errorf("reading LockGrant %s: %w", r.grant, err)
		case string(g.UID) != grantUID:
			g = nil // another acquisition under the same name
		}
	}
	c := &lockingv1alpha1.FenceCounter{}
	key := types.NamespacedName{Namespace: k.Namespace, Name: lockingv1alpha1.FenceCounterName(k.Resource)}
	switch err := r.reader.Get(ctx, key, c); {
	case apierrors.IsNotFound(err):
		c = nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading FenceCounter %s: %w", key, err)
	}
	return facts.Grant(g), facts.Counter(c), nil
}
