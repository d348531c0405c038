// Package replicacache lets a controller own a cache of its own (a label
// selected or otherwise narrowed copy of some kind) that runs on every
// manager replica, leader or not.
//
// controller-runtime starts a bare cache.Cache added with Manager.Add only on
// the elected leader: it does not say NeedLeaderElection, so it counts as a
// leader-only runnable. A controller that runs on every replica and reads
// such a cache then waits on a cache that never starts, and its replica stops
// after the controller's cache-sync timeout. Wrapped by Of, the cache joins
// the manager's group of caches instead: it starts on every replica, and is
// synced before any controller starts.
package replicacache

import (
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Of returns c as a runnable of the manager's cache group, for Manager.Add.
func Of(c cache.Cache) manager.Runnable { return everyReplica{c} }

// everyReplica is a cache that says GetCache, which is how the manager
// recognises the runnables of its cache group.
type everyReplica struct{ cache.Cache }

// GetCache returns the cache itself.
func (c everyReplica) GetCache() cache.Cache { return c.Cache }

var _ interface {
	manager.Runnable
	GetCache() cache.Cache
} = everyReplica{}
