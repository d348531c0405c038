package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// lease is one acquisition, held with the shipped lock.Handle: Acquire
// creates and follows the grant, the handle renews it, closes Done when
// ownership is unknown or lost, stamps every write (Stamp checks it may),
// and Release gives it back. The worker records what the handle reports
// through its trace (lock.WithTrace): its renewals, and its entry into and
// exit from OWNERSHIP_UNKNOWN with the local deadline.
type lease struct {
	w        *worker
	resource string
	key      types.NamespacedName
	h        *lock.Handle
	// c is the acquisition's own client, cut when the worker walks away.
	c *cuttable
	// changed is signalled at each step the handle reports.
	changed chan struct{}

	mu sync.Mutex
	// renewID is the history ID of the renew in flight.
	renewID string
	// quiet is set once the worker walked away: the handle's steps are no
	// longer the worker's beliefs, and are not recorded.
	quiet bool
}

// acquire asks for the lock on resource (lock.Client.Acquire) and returns
// the lease once the handle is HELD; nil if the request ended, was
// withdrawn, or the wait ran out first.
func (w *worker) acquire(ctx context.Context, resource string) *lease {
	n := w.next()
	id := fmt.Sprintf("%s-a%d", w.o.id, n)
	requestID := fmt.Sprintf("%s-%d", w.o.id, n)
	l := &lease{
		w: w, resource: resource,
		key:     types.NamespacedName{Namespace: w.o.namespace, Name: lockingv1alpha1.GrantNameForRequest(requestID)},
		c:       &cuttable{WithWatch: w.c},
		changed: make(chan struct{}, 1),
	}
	w.rec.emit(Event{Kind: EventInvoke, Op: OpAcquire, ID: id, Resource: resource, Grant: l.key.Name})
	// Give up a while after the server-side wait limit, in case the
	// controller is down and cannot time the request out (Acquire then
	// withdraws it).
	actx, cancel := context.WithTimeout(ctx, w.o.waitTimeout+2*w.o.ttl+20*time.Second)
	defer cancel()
	// No session: the workers' grants live by their leases alone.
	locks := lock.NewClient(l.c, lock.WithNamespace(w.o.namespace), lock.WithoutSession())
	h, err := locks.Acquire(actx, resource,
		lock.WithTTL(w.o.ttl), lock.WithWait(w.o.waitTimeout), lock.WithRequestID(requestID),
		lock.WithTrace(l.trace), lock.WithLogger(logf.Log.WithName(w.o.id)))
	if err != nil {
		w.rec.emit(Event{Kind: EventFail, Op: OpAcquire, ID: id, Resource: resource, Grant: l.key.Name, Reason: acquireFailure(ctx, err), Detail: err.Error()})
		return nil
	}
	l.h = h
	w.rec.emit(Event{Kind: EventOK, Op: OpAcquire, ID: id, Resource: resource, Grant: l.key.Name, UID: string(h.Info().UID), Fence: h.Info().Fence})
	return l
}

// acquireFailure names why Acquire returned no handle, for the history.
func acquireFailure(ctx context.Context, err error) string {
	if r := fencing.ReasonOf(err); r != "" {
		return string(r)
	}
	switch {
	case errors.Is(err, lock.ErrWaitTimeout):
		return string(fencing.ReasonTimedOut)
	case errors.Is(err, lock.ErrWithdrawn):
		return "WITHDRAWN"
	case ctx.Err() != nil:
		return "STOPPED"
	}
	return "UNAVAILABLE"
}

// trace records one step of the handle (lock.WithTrace).
func (l *lease) trace(e lock.TraceEvent) {
	select {
	case l.changed <- struct{}{}:
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.quiet {
		return
	}
	w := l.w
	base := Event{Resource: l.resource, Grant: e.Grant.Name, UID: string(e.UID), Fence: e.Fence, Time: e.Time}
	switch e.Kind {
	case lock.TraceRenewSent:
		l.renewID = fmt.Sprintf("%s-n%d", w.o.id, w.next())
		ev := base
		ev.Kind, ev.Op, ev.ID, ev.Count = EventInvoke, OpRenew, l.renewID, e.Renewals
		w.rec.emit(ev)
	case lock.TraceRenewAnswered:
		if l.renewID == "" {
			return
		}
		ev := base
		ev.Op, ev.ID, ev.Count = OpRenew, l.renewID, e.Renewals
		ev.Kind, ev.Reason = classify(e.RenewErr)
		if ev.Kind == EventInfo {
			ev.Detail = e.RenewErr.Error()
		}
		l.renewID = ""
		w.rec.emit(ev)
	case lock.TraceState:
		switch {
		case e.State == holder.OwnershipUnknown:
			ev := base
			ev.Kind, ev.Op = EventNote, NoteUnknownBegin
			if !e.Deadline.IsZero() {
				ev.Deadline = timePtr(e.Deadline)
			}
			w.rec.emit(ev)
		case e.Previous == holder.OwnershipUnknown:
			ev := base
			ev.Kind, ev.Op, ev.Reason = EventNote, NoteUnknownEnd, e.State.String()
			w.rec.emit(ev)
		}
	case lock.TraceDone:
		ev := base
		ev.Kind, ev.Op, ev.Reason = EventNote, NoteDone, doneReason(e)
		if e.Err != nil {
			ev.Detail = e.Err.Error()
		}
		w.rec.emit(ev)
	}
}

// doneReason names why a handle's Done closed: OWNERSHIP_UNKNOWN, RELEASED
// (by its holder), or the reason the registry gave.
func doneReason(e lock.TraceEvent) string {
	switch {
	case errors.Is(e.Err, lock.ErrOwnershipUnknown):
		return holder.OwnershipUnknown.String()
	case errors.Is(e.Err, lock.ErrReleased):
		return string(fencing.ReasonReleased)
	}
	return string(fencing.ReasonOf(e.Err))
}

// holds reports whether the handle may start an effect now (Handle.Check).
func (l *lease) holds() bool {
	_, err := l.h.Check()
	return err == nil
}

// wait passes up to d, or less if ctx ends or the handle's Done closes.
func (l *lease) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-l.h.Context().Done():
	}
}

// settle waits up to d, or until ctx ends, for the handle's state to
// satisfy cond, and reports whether it does.
func (l *lease) settle(ctx context.Context, d time.Duration, cond func(holder.State) bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for !cond(l.h.State()) {
		select {
		case <-l.changed:
		case <-t.C:
			return cond(l.h.State())
		case <-ctx.Done():
			return cond(l.h.State())
		}
	}
	return true
}

// release gives the grant back with Handle.Release (a no-op once the
// handle knows the acquisition ended), recording the request.
func (l *lease) release(ctx context.Context) {
	if l.h.State().Final() {
		return
	}
	w := l.w
	ev := Event{Op: OpRelease, ID: fmt.Sprintf("%s-x%d", w.o.id, w.next()), Resource: l.resource, Grant: l.key.Name, UID: string(l.h.Info().UID)}
	w.rec.emit(withKind(ev, EventInvoke))
	rctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	err := l.h.Release(rctx)
	switch r := fencing.ReasonOf(err); {
	case err == nil:
		w.rec.emit(withKind(ev, EventOK))
	case r != "":
		ev.Reason = string(r)
		w.rec.emit(withKind(ev, EventFail))
	default:
		ev.Detail = err.Error()
		w.rec.emit(withKind(ev, EventInfo))
	}
}

// abandon walks away from the grant without releasing it, as a process
// that has gone away: the handle's requests fail from now on, so it can
// renew no more and the lease runs out at the registry. What the handle
// reports afterwards is not recorded.
func (l *lease) abandon() {
	l.mu.Lock()
	l.quiet = true
	l.mu.Unlock()
	l.c.cut.Store(true)
}

// cuttable is one acquisition's client: the worker's own until cut, then
// one whose every request fails at once.
type cuttable struct {
	client.WithWatch
	cut atomic.Bool
}

var errWalkedAway = errors.New("the worker walked away from this grant")

func (c *cuttable) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if c.cut.Load() {
		return errWalkedAway
	}
	return c.WithWatch.Get(ctx, key, obj, opts...)
}

func (c *cuttable) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if c.cut.Load() {
		return errWalkedAway
	}
	return c.WithWatch.List(ctx, list, opts...)
}

func (c *cuttable) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	if c.cut.Load() {
		return nil, errWalkedAway
	}
	return c.WithWatch.Watch(ctx, list, opts...)
}

func (c *cuttable) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if c.cut.Load() {
		return errWalkedAway
	}
	return c.WithWatch.Create(ctx, obj, opts...)
}

func (c *cuttable) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if c.cut.Load() {
		return errWalkedAway
	}
	return c.WithWatch.Patch(ctx, obj, patch, opts...)
}
