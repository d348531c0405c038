package lockgrant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
)

// statusWriter writes the statuses a pass decided after the pass has
// returned, so that the resource's next pass (the next swap of its
// counter) never waits behind them: the counter is the holder of record,
// and the statuses are its copy for users, written after it.
//
// Each resource's statuses are written one at a time, in the order its
// passes decided them (the ended holders of a pass first, then its new
// holders, then the rest). A status still waiting when a later pass plans
// the same grant's is replaced by the later one, so a burst of passes
// costs one write per grant. Each write replaces the grant's whole status
// and names its UID (a JSON patch that tests metadata.uid), so an owner's
// renew or release in between does not conflict with it; what keeps a
// late status from replacing a newer one is the status's own transition
// rules (LockGrantStatus: a final phase, an issued fence and a published
// record never change, and counterGeneration never decreases).
//
// A failed write drops the resource's statuses queued behind it, and with
// them this replica's record of having planned them. A pass of the
// resource running meanwhile may have decided on those plans (an ended
// holder it took as Released); its own statuses are then refused at
// enqueue (errStatusesDropped) and the pass decides again, so that no new
// holder is written Held while the grant it replaced still reads Held.
//
// Events and the transitions metric follow a status once it is written.
type statusWriter struct {
	r *Reconciler
	// needLeader mirrors the controller's: the writer runs wherever the
	// controller does.
	needLeader bool
	// kick asks the controller for a pass over a resource (a write was
	// refused, or never got through): a FenceCounter named as the
	// resource's reconcile request.
	kick chan event.TypedGenericEvent[*lockingv1alpha1.FenceCounter]

	ready chan struct{}
	ctx   context.Context
	wg    sync.WaitGroup

	mu     sync.Mutex
	queues map[types.NamespacedName]*statusQueue
	// passes holds the resources whose pass is deciding (the work queue
	// runs one pass of a resource at a time): true once a status of the
	// resource was dropped since the pass began.
	passes map[types.NamespacedName]bool
}

// errStatusesDropped: statuses planned by this replica were dropped after
// the pass began, so it may have decided on plans that were never written.
var errStatusesDropped = errors.New("statuses this pass may have decided on were dropped; deciding again")

var _ manager.LeaderElectionRunnable = (*statusWriter)(nil)

// statusQueue is one resource's statuses waiting to be written.
type statusQueue struct {
	items []*statusItem
}

// statusItem is one grant's planned status.
type statusItem struct {
	grant  *lockingv1alpha1.LockGrant
	seq    uint64
	events []grantplan.Event
}

func newStatusWriter(r *Reconciler, needLeader bool) *statusWriter {
	return &statusWriter{
		r: r, needLeader: needLeader, ready: make(chan struct{}),
		kick:   make(chan event.TypedGenericEvent[*lockingv1alpha1.FenceCounter], 64),
		queues: map[types.NamespacedName]*statusQueue{},
		passes: map[types.NamespacedName]bool{},
	}
}

// begin records that a pass of resource starts deciding: from now on, a
// dropped status of resource makes its enqueue fail.
func (w *statusWriter) begin(resource types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.passes[resource] = false
}

// end records that the pass of resource has returned.
func (w *statusWriter) end(resource types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.passes, resource)
}

// Start runs the writer until ctx ends, then waits for the writes in
// flight.
func (w *statusWriter) Start(ctx context.Context) error {
	w.ctx = ctx
	close(w.ready)
	<-ctx.Done()
	w.wg.Wait()
	return nil
}

// NeedLeaderElection is the controller's.
func (w *statusWriter) NeedLeaderElection() bool { return w.needLeader }

// enqueue hands a pass's statuses to the writer, in the plan's order,
// and records each as this replica's own (the next pass decides on it).
// It returns at once, or when ctx ends before the writer has started. It
// returns errStatusesDropped, queuing nothing, when a status of resource
// was dropped since the pass began (begin).
func (w *statusWriter) enqueue(ctx context.Context, resource types.NamespacedName, statuses []*lockingv1alpha1.LockGrant, events []grantplan.Event) error {
	if len(statuses) == 0 {
		return nil
	}
	select {
	case <-w.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	now := w.r.Clock.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.passes[resource] {
		return errStatusesDropped
	}
	q := w.queues[resource]
	start := q == nil
	if start {
		q = &statusQueue{}
		w.queues[resource] = q
	}
	for _, g := range statuses {
		it := &statusItem{grant: g, seq: w.r.own.planStatus(g.UID, &g.Status, now), events: eventsOf(g, events)}
		if i := indexOf(q.items, g.UID); i >= 0 {
			// Not sent yet: the later plan replaces it, and announces
			// both plans' transitions. It takes its place in the later
			// plan's order, behind the ended holders written first.
			it.events = append(q.items[i].events, it.events...)
			q.items = slices.Delete(q.items, i, i+1)
		}
		q.items = append(q.items, it)
	}
	if start {
		w.wg.Add(1)
		go w.run(resource)
	}
	return nil
}

// run writes resource's statuses until none is left.
func (w *statusWriter) run(resource types.NamespacedName) {
	defer w.wg.Done()
	ctx := logf.IntoContext(w.ctx, logf.FromContext(w.ctx).WithValues("controller", "lockgrant", "resource", resource.String()))
	for {
		w.mu.Lock()
		q := w.queues[resource]
		if len(q.items) == 0 {
			delete(w.queues, resource)
			w.mu.Unlock()
			return
		}
		it := q.items[0]
		q.items = q.items[1:]
		w.mu.Unlock()
		if err := w.write(ctx, it); err != nil {
			// The statuses planned after this one are not written either:
			// they may say that a grant holds which must not read Held
			// before this one has ended (the pass's order). They are
			// decided again, from what is stored.
			w.mu.Lock()
			rest := append([]*statusItem{it}, q.items...)
			q.items = nil
			if _, deciding := w.passes[resource]; deciding {
				w.passes[resource] = true
			}
			w.mu.Unlock()
			for _, r := range rest {
				w.r.own.wroteStatus(r.grant.UID, r.seq, "", w.r.Clock.Now())
			}
			if ctx.Err() != nil {
				continue // stopping: forget the rest
			}
			logf.FromContext(ctx).V(1).Info("Status not written; deciding the resource again", "grant", it.grant.Name, "dropped", len(rest)-1, "error", err.Error())
			w.again(ctx, resource)
		}
	}
}

// Backoff of a status write that failed for a reason that may pass (a
// timeout, a throttle, an unavailable server): from statusRetryFirst,
// doubling, for at most statusRetries attempts.
const (
	statusRetryFirst = 10 * time.Millisecond
	statusRetries    = 6
	// statusAgainAfter is how long after a refused status write the
	// resource is decided again: the refusal means a newer status is
	// stored, which the cache delivers in a moment.
	statusAgainAfter = 50 * time.Millisecond
)

// write writes one status, retrying what may pass, unless a later plan
// for the same grant has been queued meanwhile (that one is written
// instead). A grant gone meanwhile needs no status.
func (w *statusWriter) write(ctx context.Context, it *statusItem) error {
	delay := statusRetryFirst
	for attempt := 1; ; attempt++ {
		w.r.own.writingStatus(it.grant.UID, it.seq)
		err := w.r.patchStatus(ctx, it.grant)
		switch {
		case err == nil:
			w.r.own.wroteStatus(it.grant.UID, it.seq, it.grant.ResourceVersion, w.r.Clock.Now())
			w.r.emit(ctx, it.grant, it.events)
			return nil
		case apierrors.IsNotFound(err):
			w.r.own.wroteStatus(it.grant.UID, it.seq, "", w.r.Clock.Now())
			return nil
		case attempt >= statusRetries || !retriable(err) || w.superseded(it):
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay *= 2
	}
}

// superseded reports whether a later plan for it's grant is queued.
func (w *statusWriter) superseded(it *statusItem) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, q := range w.queues {
		if indexOf(q.items, it.grant.UID) >= 0 {
			return true
		}
	}
	return false
}

// again asks for a pass over resource shortly.
func (w *statusWriter) again(ctx context.Context, resource types.NamespacedName) {
	t := time.NewTimer(statusAgainAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	ev := event.TypedGenericEvent[*lockingv1alpha1.FenceCounter]{Object: &lockingv1alpha1.FenceCounter{}}
	ev.Object.Namespace, ev.Object.Name = resource.Namespace, resource.Name
	select {
	case w.kick <- ev:
	case <-ctx.Done():
	}
}

// refused reports whether the API server refused a status write because
// what it names is not what the pass decided on: the stored status is
// newer (its transition rules), or the grant is another one under the
// same name (the patch's UID test).
func refused(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.ReasonForError(err) == metav1.StatusReasonUnknown && statusCode(err) == http.StatusUnprocessableEntity
}

// statusCode is the HTTP status of an API error, 0 for another error.
func statusCode(err error) int {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return int(s.Status().Code)
	}
	return 0
}

// retriable reports whether a write that failed with err may succeed if
// sent again unchanged.
func retriable(err error) bool {
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err) ||
		!isAPIStatus(err)
}

func isAPIStatus(err error) bool {
	var s apierrors.APIStatus
	return errors.As(err, &s)
}

// patchStatus replaces g's whole status with g.Status, on the grant with
// g's UID only (a JSON patch whose test names it): a grant deleted and
// created again under the same name is not touched. The API server's
// transition rules refuse a status older than the stored one. g's
// resourceVersion is updated from the answer.
func (r *Reconciler) patchStatus(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": g.UID},
		{"op": "add", "path": "/status", "value": g.Status},
	})
	if err != nil {
		return err
	}
	if err := r.Client.Status().Patch(ctx, g, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return fmt.Errorf("writing status of grant %s: %w", g.Name, err)
	}
	return nil
}

// eventsOf returns the events of g.
func eventsOf(g *lockingv1alpha1.LockGrant, events []grantplan.Event) []grantplan.Event {
	var out []grantplan.Event
	for _, e := range events {
		if e.Grant.UID == g.UID {
			out = append(out, e)
		}
	}
	return out
}

func indexOf(items []*statusItem, uid types.UID) int {
	for i, it := range items {
		if it.grant.UID == uid {
			return i
		}
	}
	return -1
}
