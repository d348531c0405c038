package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Keys of a guarded counter ConfigMap's data.
const (
	// countKey holds the counter, in decimal.
	countKey = "count"
	// writeKey holds the ID of the write that produced this version, so the
	// checker can tell which write, of unknown outcome or not, took effect.
	writeKey = "write"
)

// objectName is the guarded ConfigMap of a resource: "counter-" and the
// resource's last segment.
func objectName(resource string) string {
	return "counter-" + resource[strings.LastIndex(resource, "/")+1:]
}

// increment reads the resource's counter, computes for a moment (the
// handle renewing meanwhile), and writes count+1 stamped by the handle
// (Handle.Stamp: the grant, its fence and its proof) under a
// resourceVersion precondition (a create when the object does not exist).
// It writes nothing unless Stamp's check passes just before; but between
// that check and the request a process can always be paused, and the chaos
// driver makes sure some are (pauseIfArmed): those late writes are the
// ones admission must refuse.
// It reports whether the worker may go on writing under l: false once
// admission refused the grant or the handle's Done closed.
func (w *worker) increment(ctx context.Context, l *lease) bool {
	key := client.ObjectKey{Namespace: w.o.namespace, Name: objectName(l.resource)}
	read := Event{Op: OpRead, ID: w.nextID("r"), Resource: l.resource, Object: key.Name}
	w.rec.emit(withKind(read, EventInvoke))
	cm := &corev1.ConfigMap{}
	rctx, cancel := w.requestCtx(ctx)
	err := w.c.Get(rctx, key, cm)
	cancel()
	exists := true
	switch {
	case err == nil:
		read.Count, _ = strconv.ParseInt(cm.Data[countKey], 10, 64)
		read.RV = cm.ResourceVersion
		read.Fence, _ = fencing.ParseFence(cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation])
		read.WriteID = cm.Data[writeKey]
		w.rec.emit(withKind(read, EventOK))
	case apierrors.IsNotFound(err):
		exists = false
		w.rec.emit(withKind(read, EventOK))
	default:
		read.Detail = err.Error()
		w.rec.emit(withKind(read, EventInfo))
		return l.holds()
	}

	l.wait(ctx, w.between(0, maxCompute))
	if !exists {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	}
	write := Event{
		Op: OpWrite, ID: w.nextID("w"), Resource: l.resource, Object: key.Name,
		Grant: l.key.Name, UID: string(l.h.Info().UID), Fence: l.h.Info().Fence, ExpectRV: read.RV, Count: read.Count + 1,
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[countKey] = strconv.FormatInt(write.Count, 10)
	cm.Data[writeKey] = write.ID
	// The last check: the handle stamps the write only while it may start
	// an effect.
	if err := l.h.Stamp(cm); err != nil {
		return false
	}
	if w.pauseIfArmed(ctx, write) && exists {
		// Resumed long after its lease ended, the write goes out without
		// its resourceVersion precondition, as a client that does not
		// compare-and-swap would send it: a successor's writes then cannot
		// turn it into a conflict, and the fence is the only thing that
		// can stop it.
		cm.ResourceVersion = ""
		write.ExpectRV, write.Unconditional = "", true
	}
	w.rec.emit(withKind(write, EventInvoke))
	rctx, cancel = w.requestCtx(ctx)
	if exists {
		err = w.c.Update(rctx, cm)
	} else {
		err = w.c.Create(rctx, cm)
	}
	cancel()
	switch outcome, reason := classify(err); outcome {
	case EventOK:
		write.RV = cm.ResourceVersion
		w.rec.emit(withKind(write, EventOK))
	case EventFail:
		write.Reason = reason
		w.rec.emit(withKind(write, EventFail))
		if reason != reasonConflict {
			return false // admission refused the grant: stop using it
		}
	default:
		write.Detail = err.Error()
		w.rec.emit(withKind(write, EventInfo))
	}
	return l.holds()
}

// stray sends, once l has ended, what a replica that lost its lease still
// sends to the resource's guarded object: a merge patch of data only (it
// inherits whatever the stored object carries) or a delete without a
// precondition. Neither asserts a claim of its own, so admission must refuse
// both; the checker counts any that took effect.
func (w *worker) stray(ctx context.Context, l *lease) {
	resource := w.strayTarget(ctx, l.resource)
	if ctx.Err() != nil {
		return
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.o.namespace, Name: objectName(resource)}}
	e := Event{Op: OpStray, ID: w.nextID("s"), Resource: resource, Object: cm.Name, Grant: l.key.Name, UID: string(l.h.Info().UID), Fence: l.h.Info().Fence}
	rctx, cancel := w.requestCtx(ctx)
	defer cancel()
	var err error
	if w.rnd.Float64() < 0.5 {
		e.Detail = "merge-patch"
		w.rec.emit(withKind(e, EventInvoke))
		patch := fmt.Sprintf(`{"data":{%q:"-1",%q:%q}}`, countKey, writeKey, e.ID)
		err = w.c.Patch(rctx, cm, client.RawPatch(types.MergePatchType, []byte(patch)))
	} else {
		e.Detail = "delete"
		w.rec.emit(withKind(e, EventInvoke))
		err = w.c.Delete(rctx, cm)
	}
	outcome, reason := classify(err)
	e.Reason = reason
	if outcome == EventInfo {
		e.Detail += ": " + err.Error()
	}
	w.rec.emit(withKind(e, outcome))
}

// strayTarget picks the resource a stray request goes to, reading like a
// retry loop before it sends. A replica sharing its identity with another
// worker (the case only the claim tells apart) waits, up to strayWait, for
// that worker to hold a grant and to have written its object, and targets
// it; any other worker waits for a successor to write the object of the
// resource it held. Either way it goes on after strayWait.
func (w *worker) strayTarget(ctx context.Context, held string) string {
	target := held
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, strayWait, true, func(ctx context.Context) (bool, error) {
		rctx, cancel := w.requestCtx(ctx)
		defer cancel()
		writer := func(resource string) string {
			cm := &corev1.ConfigMap{}
			if err := w.c.Get(rctx, client.ObjectKey{Namespace: w.o.namespace, Name: objectName(resource)}, cm); err != nil {
				return ""
			}
			id := cm.Data[writeKey]
			return id[:max(0, strings.LastIndex(id, "-"))]
		}
		if w.o.replicaOf == "" {
			who := writer(held)
			return who != "" && who != w.o.id, nil
		}
		var grants lockingv1alpha1.LockGrantList
		if err := w.c.List(rctx, &grants, client.InNamespace(w.o.namespace)); err != nil {
			return false, nil
		}
		for _, g := range grants.Items {
			if g.Status.Phase == lockingv1alpha1.PhaseHeld && strings.HasPrefix(g.Spec.RequestID, w.o.replicaOf+"-") &&
				writer(g.Spec.Resource) == w.o.replicaOf {
				target = g.Spec.Resource
				return true, nil
			}
		}
		return false, nil
	})
	return target
}

// pauseIfArmed stops the worker (SIGSTOP to itself) if the chaos driver
// armed it (SIGUSR1): after the last validity check, with the write
// prepared, as a GC pause or a stalled VM would. The driver resumes it past
// the end of its lease; the write then goes out with its old fence. It
// reports whether the worker paused.
func (w *worker) pauseIfArmed(ctx context.Context, write Event) bool {
	if ctx.Err() != nil || !w.armed.CompareAndSwap(true, false) {
		return false
	}
	w.rec.emit(Event{Kind: EventNote, Op: NotePaused, ID: write.ID, Resource: write.Resource, Grant: write.Grant, Fence: write.Fence})
	// Sent to this very thread, SIGSTOP stops the process before the
	// thread runs on; sent to the process, another thread could take it
	// and this one could send the write first.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
	return true
}
