package main

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// Lease-loop timing. Retries of requests whose outcome is unknown, and
// reads when a watch may have missed something; none of them is needed for
// safety, only to make progress sooner.
const (
	renewRetry   = 500 * time.Millisecond
	unknownRead  = 500 * time.Millisecond
	pendingRead  = time.Second
	queuedRead   = 2 * time.Second
	createRetry  = 300 * time.Millisecond
	releaseTries = 5
)

// lease is one acquisition, kept by the holder state machine: a small
// lease loop on pkg/lock/holder and the controller-runtime client. The
// machine decides; the loop sends what it asks for (renewals, reads) and
// feeds it every answer, and records each request in the history.
type lease struct {
	w        *worker
	resource string
	key      types.NamespacedName
	uid      types.UID
	m        *holder.Machine
	proof    string

	// updates carries the grant as a watch sees it.
	updates   chan *lockingv1alpha1.LockGrant
	stopWatch context.CancelFunc

	lastRead     holder.Mono
	renewRetryAt holder.Mono
	// state is the machine state last recorded.
	state holder.State
}

// never is a Mono later than any run.
const never = holder.Mono(1<<63 - 1)

// acquire creates a grant on resource and waits until the holder machine
// says it is Held (nil if it ended or the wait ran out first; the grant is
// then withdrawn).
func (w *worker) acquire(ctx context.Context, resource string) *lease {
	requestID := fmt.Sprintf("%s-%d", w.o.id, w.seq+1)
	name := lockingv1alpha1.GrantNameForRequest(requestID)
	id := w.nextID("a")
	m, err := holder.New(holder.Config{TTL: w.o.ttl})
	if err != nil {
		panic(err) // the TTL was checked at start
	}
	l := &lease{
		w: w, resource: resource, m: m, state: m.State(),
		key:      types.NamespacedName{Namespace: w.o.namespace, Name: name},
		updates:  make(chan *lockingv1alpha1.LockGrant, 64),
		lastRead: w.mono(), renewRetryAt: never,
	}
	w.rec.emit(Event{Kind: EventInvoke, Op: OpAcquire, ID: id, Resource: resource, Grant: name})
	var wctx context.Context
	wctx, l.stopWatch = context.WithCancel(ctx)
	go l.watch(wctx)

	// Give up waiting a while after the server-side wait limit, in case the
	// controller is down and cannot time the request out.
	giveUp := w.mono() + holder.Mono(w.o.waitTimeout+2*w.o.ttl+20*time.Second)
	if reason := l.create(ctx, requestID, giveUp); reason != "" {
		w.rec.emit(Event{Kind: EventFail, Op: OpAcquire, ID: id, Resource: resource, Grant: name, Reason: reason})
		l.close()
		return nil
	}
	l.keep(ctx, time.Duration(giveUp-w.mono()), func() bool { return l.valid() })
	if l.valid() {
		w.rec.emit(Event{Kind: EventOK, Op: OpAcquire, ID: id, Resource: resource, Grant: name, UID: string(l.uid), Fence: l.m.Fence()})
		return l
	}
	reason := string(l.m.Reason())
	if reason == "" {
		reason = "WITHDRAWN"
		if ctx.Err() != nil {
			reason = "STOPPED"
		}
		if l.m.State() == holder.OwnershipUnknown {
			reason = "UNKNOWN"
		}
		l.release(context.WithoutCancel(ctx))
	}
	w.rec.emit(Event{Kind: EventFail, Op: OpAcquire, ID: id, Resource: resource, Grant: name, UID: string(l.uid), Reason: reason})
	l.close()
	return nil
}

// create sends the grant's create until one attempt has a definite answer;
// a retry after an unknown outcome finds the grant by its request ID. It
// returns "" once the grant exists, else why not.
func (l *lease) create(ctx context.Context, requestID string, giveUp holder.Mono) string {
	w := l.w
	for {
		g := &lockingv1alpha1.LockGrant{
			ObjectMeta: metav1.ObjectMeta{Name: l.key.Name, Namespace: l.key.Namespace},
			Spec: lockingv1alpha1.LockGrantSpec{
				Resource:             l.resource,
				LeaseDurationSeconds: int32(w.o.ttl / time.Second),
				WaitTimeoutSeconds:   int32(w.o.waitTimeout / time.Second),
				RequestID:            requestID,
			},
		}
		sentAt := w.mono()
		rctx, cancel := w.requestCtx(ctx)
		err := w.c.Create(rctx, g)
		cancel()
		switch {
		case err == nil:
			// This request made the grant: the registry granted it
			// after sentAt.
			l.m.Created(sentAt)
			l.uid = g.UID
			l.observe(g)
			return ""
		case apierrors.IsAlreadyExists(err):
			// An earlier attempt made it; its validity will be
			// established by a renew.
			if l.read(ctx) {
				return ""
			}
		default:
			if reason, _, ok := admissionDenial(err); ok {
				return reason
			}
		}
		if ctx.Err() != nil {
			return "STOPPED"
		}
		if w.mono() >= giveUp {
			return "UNAVAILABLE"
		}
		_ = sleep(ctx, createRetry)
	}
}

// watch follows the grant and hands every version to the lease loop.
func (l *lease) watch(ctx context.Context) {
	for ctx.Err() == nil {
		wi, err := l.w.c.Watch(ctx, &lockingv1alpha1.LockGrantList{}, client.InNamespace(l.key.Namespace),
			client.MatchingFields{"metadata.name": l.key.Name})
		if err != nil {
			_ = sleep(ctx, renewRetry)
			continue
		}
		for ev := range wi.ResultChan() {
			if g, ok := ev.Object.(*lockingv1alpha1.LockGrant); ok && g.Name == l.key.Name {
				select {
				case l.updates <- g:
				default: // the loop is behind; it reads the grant anyway
				}
			}
		}
		wi.Stop()
	}
}

// close stops the lease's watch.
func (l *lease) close() { l.stopWatch() }

// valid reports whether the worker may start an effect now.
func (l *lease) valid() bool {
	now := l.w.mono()
	l.m.Tick(now)
	l.track(now)
	return l.m.Valid(now)
}
