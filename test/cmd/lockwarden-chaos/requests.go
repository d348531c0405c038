package main

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// renew sends the renew the machine asks for (or resends the pending one).
func (l *lease) renew(ctx context.Context) {
	w := l.w
	target, ok := l.m.RenewSent(w.mono())
	l.track(w.mono())
	if !ok {
		l.renewRetryAt = never
		return
	}
	id := w.nextID("n")
	ev := Event{Op: OpRenew, ID: id, Resource: l.resource, Grant: l.key.Name, UID: string(l.uid), Count: target}
	w.rec.emit(withKind(ev, EventInvoke))
	err := l.patch(ctx, `"renewals":`+strconv.FormatInt(target, 10))
	now := w.mono()
	l.renewRetryAt = never
	switch outcome, reason := classify(err); outcome {
	case EventOK:
		w.rec.emit(withKind(ev, EventOK))
	case EventFail:
		ev.Reason = reason
		w.rec.emit(withKind(ev, EventFail))
		l.refused(now, reason)
	default:
		ev.Detail = err.Error()
		w.rec.emit(withKind(ev, EventInfo))
		l.renewRetryAt = now + holder.Mono(renewRetry)
	}
	l.track(now)
}

// release gives the grant back (or withdraws the request), retrying while
// the outcome is unknown.
func (l *lease) release(ctx context.Context) {
	w := l.w
	if l.m.State().Final() {
		return
	}
	l.m.ReleaseSent(w.mono())
	id := w.nextID("x")
	ev := Event{Op: OpRelease, ID: id, Resource: l.resource, Grant: l.key.Name, UID: string(l.uid)}
	w.rec.emit(withKind(ev, EventInvoke))
	var err error
	for try := 0; try < releaseTries; try++ {
		err = l.patch(ctx, `"release":true`)
		now := w.mono()
		switch outcome, reason := classify(err); outcome {
		case EventOK:
			w.rec.emit(withKind(ev, EventOK))
			l.m.ReleaseAccepted(now)
			l.track(now)
			return
		case EventFail:
			ev.Reason = reason
			w.rec.emit(withKind(ev, EventFail))
			l.refused(now, reason)
			return
		}
		if sleep(ctx, createRetry) != nil {
			break
		}
	}
	ev.Detail = err.Error()
	w.rec.emit(withKind(ev, EventInfo))
}

// patch merge-patches the grant's spec with a UID precondition, so it acts
// on this acquisition only.
func (l *lease) patch(ctx context.Context, spec string) error {
	body := fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{%s}}`, l.uid, spec)
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: l.key.Name, Namespace: l.key.Namespace}}
	rctx, cancel := l.w.requestCtx(ctx)
	defer cancel()
	err := l.w.c.Patch(rctx, g, client.RawPatch(types.MergePatchType, []byte(body)))
	if err == nil {
		l.observe(g)
	}
	return err
}

// refused applies a definite refusal of a renew or release.
func (l *lease) refused(now holder.Mono, reason string) {
	// A failed UID precondition: the name belongs to another acquisition.
	if reason == reasonGone || reason == reasonConflict {
		l.m.Observe(now, holder.Facts{Gone: true})
	} else {
		l.m.Refused(now, fencing.Reason(reason))
	}
	l.track(now)
}

func withKind(e Event, kind string) Event {
	e.Kind = kind
	return e
}

// reasonGone and reasonConflict are the history's codes for a write that
// failed on a precondition: the grant's UID (the grant is gone) or the
// object's resourceVersion.
const (
	reasonGone     = "GONE"
	reasonConflict = "CONFLICT"
)

// classify sorts a request's error into EventOK (nil), EventFail (no
// effect, certainly: an admission refusal, whose reason code it returns, or
// a failed precondition) and EventInfo (unknown: the request may or may not
// have taken effect).
func classify(err error) (string, string) {
	if err == nil {
		return EventOK, ""
	}
	if reason, _, ok := admissionDenial(err); ok {
		return EventFail, reason
	}
	switch {
	case apierrors.IsNotFound(err):
		return EventFail, reasonGone
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return EventFail, reasonConflict
	case apierrors.IsForbidden(err):
		return EventFail, "FORBIDDEN"
	}
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return EventFail, "INVALID"
	}
	return EventInfo, ""
}

// admissionDenial returns the reason code and the message, from the code
// on, of a request refused by a lockwarden admission webhook, as the public
// decoder (pkg/fencing/denial) reads it; ok is false for any other error.
func admissionDenial(err error) (reason, message string, ok bool) {
	r := denial.Refusal(err)
	if r == nil {
		return "", "", false
	}
	return string(r.Reason), r.Error(), true
}
