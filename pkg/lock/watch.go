package lock

import (
	"context"
	"fmt"
	"math"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// listThenWatch lists the objects of newList's kind selected by opts, calls
// onList with them, then calls onEvent for every change a watch reports from
// the list's resourceVersion on. When the watch ends or fails, it lists again
// (onList sees the fresh state) and resumes. It returns when ctx ends
// (ctx.Err()), a callback returns an error or stop, or a list or watch fails
// with an error giveUp (when set) reports as final: that error is returned.
// It pauses before a list or watch that follows a failed one on clk.
func listThenWatch[T client.Object](ctx context.Context, c client.WithWatch, clk clock.WithTicker, newList func() client.ObjectList, opts []client.ListOption,
	giveUp func(error) bool,
	onList func([]T) (stop bool, err error),
	onEvent func(watch.EventType, T) (stop bool, err error),
) error {
	// Reconnecting: 100 ms doubling to 1 s, jittered, so that a watch
	// broken by a partition is back within about a second of the heal.
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: time.Second}
	}
	backoff := newBackoff()
	// failed decides what a failed list or watch does: end (ctx ended, or
	// giveUp) or pause and try again.
	failed := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if giveUp != nil && giveUp(err) {
			return err
		}
		t := clk.NewTimer(backoff.Step())
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C():
			return nil
		}
	}
	for {
		list := newList()
		lctx, cancel := context.WithTimeout(ctx, requestTimeout)
		err := c.List(lctx, list, opts...)
		cancel()
		if err != nil {
			if err := failed(err); err != nil {
				return err
			}
			continue
		}
		items, err := itemsOf[T](list)
		if err != nil {
			return err
		}
		if stop, err := onList(items); stop || err != nil {
			return err
		}
		wopts := append(append([]client.ListOption{}, opts...), &client.ListOptions{Raw: &metav1.ListOptions{
			ResourceVersion: list.GetResourceVersion(), AllowWatchBookmarks: true,
		}})
		w, err := c.Watch(ctx, newList(), wopts...)
		if err != nil {
			if err := failed(err); err != nil {
				return err
			}
			continue
		}
		stop, err := drain(ctx, w, onEvent)
		w.Stop()
		if stop || err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		backoff = newBackoff()
	}
}

// itemsOf returns the items of a typed list, each as a pointer into it.
func itemsOf[T client.Object](list client.ObjectList) ([]T, error) {
	objs, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	items := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			items = append(items, t)
		}
	}
	return items, nil
}

// drain feeds one watch's events to onEvent until the watch ends.
func drain[T client.Object](ctx context.Context, w watch.Interface, onEvent func(watch.EventType, T) (bool, error)) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				o, ok := ev.Object.(T)
				if !ok {
					continue
				}
				if stop, err := onEvent(ev.Type, o); stop || err != nil {
					return stop, err
				}
			case watch.Error:
				// Typically 410 Gone: the resourceVersion is too old. List again.
				return false, nil
			}
		}
	}
}

// byName selects one object by name.
func byName(key types.NamespacedName) []client.ListOption {
	return []client.ListOption{&client.ListOptions{
		Namespace:     key.Namespace,
		FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name),
	}}
}

// grantList is a new LockGrantList, for listThenWatch.
func grantList() client.ObjectList { return &lockingv1alpha1.LockGrantList{} }

// watchOne calls fn with the current state of the one object byName(key)
// selects (nil when it does not exist), read directly, and then with every
// change a watch reports, until fn returns true or an error, ctx ends, or
// giveUp reports a failed list or watch as final. After a broken watch it
// reads the object again, so fn always sees the latest state eventually.
func watchOne[T client.Object](ctx context.Context, c client.WithWatch, clk clock.WithTicker, newList func() client.ObjectList, key types.NamespacedName,
	giveUp func(error) bool, fn func(T) (bool, error)) error {
	var none T
	return listThenWatch(ctx, c, clk, newList, byName(key), giveUp,
		func(items []T) (bool, error) {
			if len(items) == 0 {
				return fn(none)
			}
			return fn(items[0])
		},
		func(t watch.EventType, o T) (bool, error) {
			if t == watch.Deleted {
				return fn(none)
			}
			return fn(o)
		})
}

// watchGrant is watchOne for the LockGrant key: fn sees nil while it does
// not exist.
func watchGrant(ctx context.Context, c client.WithWatch, clk clock.WithTicker, key types.NamespacedName, fn func(g *lockingv1alpha1.LockGrant) (bool, error)) error {
	return watchOne(ctx, c, clk, grantList, key, nil, fn)
}

// watchCounter is watchOne for the FenceCounter key: fn sees nil while it
// does not exist. A list or watch the API server refuses for good (RBAC,
// no such kind) ends it with that error; other failures are retried.
func watchCounter(ctx context.Context, c client.WithWatch, clk clock.WithTicker, key types.NamespacedName, fn func(*lockingv1alpha1.FenceCounter) (bool, error)) error {
	return watchOne(ctx, c, clk, func() client.ObjectList { return &lockingv1alpha1.FenceCounterList{} }, key, refusedForGood, fn)
}

// refusedForGood reports whether err is an answer that retrying does not
// change: Forbidden or Unauthorized (RBAC), or a kind the server does not
// serve.
func refusedForGood(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

// WaitForGrant blocks until cond reports true for the LockGrant key, and
// returns the grant cond accepted (nil if cond accepted its absence). cond
// is called with the grant's current state, read directly from the API
// server, then with every change a watch reports; nil means the grant does
// not exist. It never polls. It returns ctx's error when ctx ends first.
//
// c must talk to the API server directly (client.NewWithWatch), not through
// a manager's cache.
func WaitForGrant(ctx context.Context, c client.WithWatch, key types.NamespacedName, cond func(*lockingv1alpha1.LockGrant) bool) (*lockingv1alpha1.LockGrant, error) {
	return waitForGrant(ctx, c, clock.RealClock{}, key, cond)
}

// waitForGrant is WaitForGrant with its reconnect pauses on clk.
func waitForGrant(ctx context.Context, c client.WithWatch, clk clock.WithTicker, key types.NamespacedName,
	cond func(*lockingv1alpha1.LockGrant) bool) (*lockingv1alpha1.LockGrant, error) {
	var got *lockingv1alpha1.LockGrant
	err := watchGrant(ctx, c, clk, key, func(g *lockingv1alpha1.LockGrant) (bool, error) {
		if cond(g) {
			got = g
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("lock: waiting for grant %s: %w", key, err)
	}
	return got, nil
}

// Transition is one change of a LockGrant's phase (or fence) seen by
// WatchTransitions.
type Transition struct {
	// Grant is the grant after the change; for a deletion, its last state.
	Grant *lockingv1alpha1.LockGrant
	// From is the phase before the change: "" when the grant is new to the
	// watcher (created, or present when the watch started).
	From lockingv1alpha1.LockGrantPhase
	// To is the phase after the change; for a deletion, the last phase.
	To lockingv1alpha1.LockGrantPhase
	// Deleted is true when the grant was deleted.
	Deleted bool
}

// WatchTransitions calls fn for every phase transition of the LockGrants
// that opts select (client.InNamespace, client.MatchingLabels, ...), in the
// order the API server reports them: first one Transition from "" for each
// grant that exists when it starts and has a phase, then one per change of
// phase or fence, and one with Deleted set per deletion. A new grant is
// reported once the controller has given it a phase. After a broken watch it lists again and
// reports what changed meanwhile (intermediate phases may then be skipped:
// it reports states, not every write). It runs until ctx ends (returning
// ctx.Err()) or fn returns an error (returned as is).
//
// c must talk to the API server directly (client.NewWithWatch). Inside a
// controller-runtime manager, use PhaseChanged with the manager's own watch
// instead.
func WatchTransitions(ctx context.Context, c client.WithWatch, fn func(Transition) error, opts ...client.ListOption) error {
	type seen struct {
		phase lockingv1alpha1.LockGrantPhase
		fence int64
		grant *lockingv1alpha1.LockGrant
	}
	known := map[types.UID]seen{}
	report := func(g *lockingv1alpha1.LockGrant, deleted bool) error {
		old, had := known[g.UID]
		if deleted {
			if !had {
				return nil
			}
			delete(known, g.UID)
			return fn(Transition{Grant: g, From: old.phase, To: old.phase, Deleted: true})
		}
		known[g.UID] = seen{phase: g.Status.Phase, fence: g.Status.FenceToken, grant: g}
		if old.phase == g.Status.Phase && old.fence == g.Status.FenceToken {
			return nil // no change, or new and not answered yet
		}
		return fn(Transition{Grant: g, From: old.phase, To: g.Status.Phase})
	}
	return listThenWatch(ctx, c, clock.RealClock{}, grantList, opts, nil,
		func(items []*lockingv1alpha1.LockGrant) (bool, error) {
			present := map[types.UID]bool{}
			for _, g := range items {
				present[g.UID] = true
				if err := report(g, false); err != nil {
					return true, err
				}
			}
			for uid, s := range known {
				if !present[uid] {
					if err := report(s.grant, true); err != nil {
						return true, err
					}
				}
			}
			return false, nil
		},
		func(t watch.EventType, g *lockingv1alpha1.LockGrant) (bool, error) {
			err := report(g, t == watch.Deleted)
			return err != nil, err
		})
}

// PhaseChanged is a controller-runtime predicate for LockGrants that passes
// creations, deletions, and updates that change status.phase or
// status.fenceToken, and drops the rest (renewals, queue positions,
// metadata). Use it on a controller that reacts to grant transitions:
//
//	ctrl.NewControllerManagedBy(mgr).
//		For(&lockingv1alpha1.LockGrant{}, builder.WithPredicates(lock.PhaseChanged())).
//		Complete(r)
//
// The manager's cache is eventually consistent: a reconciler that must act
// only while a grant is Held reads the grant directly (mgr.GetAPIReader())
// and, for its own grant, relies on a Handle's Context, not on the event.
func PhaseChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*lockingv1alpha1.LockGrant)
			n, ok2 := e.ObjectNew.(*lockingv1alpha1.LockGrant)
			if !ok1 || !ok2 {
				return false
			}
			return o.Status.Phase != n.Status.Phase || o.Status.FenceToken != n.Status.FenceToken
		},
	}
}

// isGone reports whether err says the object does not exist.
func isGone(err error) bool { return apierrors.IsNotFound(err) }
