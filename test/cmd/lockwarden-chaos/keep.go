package main

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// keep passes up to d keeping the lease: it renews when the machine asks,
// resends a renew whose outcome is unknown, reads the grant when ownership
// is unknown or an answer is overdue, and feeds the machine every version
// the watch delivers. It returns early when the machine is final, when
// stop (if not nil) reports true, or when ctx ends.
func (l *lease) keep(ctx context.Context, d time.Duration, stop func() bool) {
	w := l.w
	until := w.mono() + holder.Mono(d)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := w.mono()
		l.m.Tick(now)
		l.track(now)
		if l.m.State().Final() || (stop != nil && stop()) || now >= until || ctx.Err() != nil {
			return
		}
		due, renewDue := l.m.NextRenew(now)
		_, _, pending := l.m.PendingRenew()
		switch {
		case renewDue && due <= now:
			l.renew(ctx)
			continue
		case pending && now >= l.renewRetryAt:
			l.renew(ctx)
			continue
		case now >= l.nextRead(pending):
			l.read(ctx)
			continue
		}
		wake := min(until, l.nextRead(pending))
		if renewDue {
			wake = min(wake, due)
		}
		if pending {
			wake = min(wake, l.renewRetryAt)
		}
		if dl, ok := l.m.Deadline(); ok && dl > now {
			wake = min(wake, dl)
		}
		timer.Reset(time.Duration(wake - now))
		select {
		case g := <-l.updates:
			l.observe(g)
		case <-timer.C:
		case <-ctx.Done():
		}
	}
}

// nextRead is when the loop next reads the grant itself.
func (l *lease) nextRead(pending bool) holder.Mono {
	switch {
	case l.m.State() == holder.OwnershipUnknown:
		return l.lastRead + holder.Mono(unknownRead)
	case pending:
		return l.lastRead + holder.Mono(pendingRead)
	case l.m.State() == holder.Requested || l.m.Releasing():
		return l.lastRead + holder.Mono(queuedRead)
	}
	return never
}

// reconcile settles OWNERSHIP_UNKNOWN by reading the grant for up to
// patience, and reports whether the lease is Valid again.
func (l *lease) reconcile(ctx context.Context, patience time.Duration) bool {
	l.keep(ctx, patience, func() bool { return l.m.State() != holder.OwnershipUnknown })
	return l.valid()
}

// observe feeds the machine one version of the grant.
func (l *lease) observe(g *lockingv1alpha1.LockGrant) {
	now := l.w.mono()
	f := holder.FactsOf(g)
	if l.uid != "" && g.UID != l.uid {
		f = holder.Facts{Gone: true} // the name belongs to another acquisition
	}
	if l.uid == "" {
		l.uid = g.UID
	}
	if !f.Gone && g.Status.Proof != "" {
		l.proof = g.Status.Proof // immutable once the grant is Held
	}
	l.m.Observe(now, f)
	l.track(now)
}

// read gets the grant and feeds the machine; it reports whether it got an
// answer.
func (l *lease) read(ctx context.Context) bool {
	w := l.w
	l.lastRead = w.mono()
	g := &lockingv1alpha1.LockGrant{}
	rctx, cancel := w.requestCtx(ctx)
	err := w.c.Get(rctx, l.key, g)
	cancel()
	switch {
	case err == nil:
		l.observe(g)
		return true
	case apierrors.IsNotFound(err):
		l.m.Observe(w.mono(), holder.Facts{Gone: true})
		l.track(w.mono())
		return true
	}
	return false
}

// track records the machine's entry into and exit from OWNERSHIP_UNKNOWN.
func (l *lease) track(now holder.Mono) {
	st := l.m.State()
	if st == l.state {
		return
	}
	w := l.w
	switch {
	case st == holder.OwnershipUnknown:
		e := Event{Kind: EventNote, Op: NoteUnknownBegin, Resource: l.resource, Grant: l.key.Name, Fence: l.m.Fence()}
		if dl, ok := l.m.Deadline(); ok {
			e.Deadline = timePtr(w.wall(dl))
		}
		w.rec.emit(e)
	case l.state == holder.OwnershipUnknown:
		w.rec.emit(Event{Kind: EventNote, Op: NoteUnknownEnd, Resource: l.resource, Grant: l.key.Name, Fence: l.m.Fence(), Reason: st.String()})
	}
	l.state = st
}
