package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// workerCommand is the hidden subcommand a worker process runs.
const workerCommand = "worker"

// worker is one settlement worker: it acquires a lease on the resource,
// writes the guarded ConfigMap once per result under its fence, computing
// for a while between writes, and optionally releases. It reports each
// step as an Event on stdout.
type worker struct {
	kubeconfig string
	actor      string
	namespace  string
	resource   string
	configMap  string
	ttlSeconds int
	results    stringList
	work       time.Duration
	release    bool
	timeout    time.Duration
	// gated: the worker runs in a lock-gated Pod, whose grant the manager
	// requested: it reads the grant, its fence and fenced resource from the
	// environment (the downward API) instead of acquiring.
	gated bool
	// readyAddr, when set, is where the worker answers readiness probes
	// (GET /readyz) from its own process: a frozen worker answers none.
	readyAddr string
	// finishOnTerm: SIGTERM does not stop the worker; it reports it and
	// finishes its writes, as a worker that completes its unit of work in
	// its grace period does.
	finishOnTerm bool
	// refused: a write was refused.
	refused bool

	c   client.WithWatch
	out *json.Encoder
	mu  sync.Mutex
	// fence is the token held, once held.
	fence int64
}

// runWorker runs `lockwarden-demo worker ...` and returns the exit code: 0
// once the worker has reported its decisions, whatever they were; 1 when it
// could not play its part.
func runWorker(args []string) int {
	w := &worker{out: json.NewEncoder(os.Stdout)}
	fs := flag.NewFlagSet(workerCommand, flag.ContinueOnError)
	fs.StringVar(&w.kubeconfig, "kubeconfig", "", "Kubeconfig of the worker's identity.")
	fs.StringVar(&w.actor, "actor", "", "Name of the worker in the story (A, B).")
	fs.StringVar(&w.namespace, "namespace", billingNamespace, "Namespace of the grant and the ConfigMap.")
	fs.StringVar(&w.resource, "resource", storyResource, "Resource ID to lock.")
	fs.StringVar(&w.configMap, "configmap", storyConfigMap, "Name of the guarded ConfigMap.")
	fs.IntVar(&w.ttlSeconds, "ttl", leaseSeconds, "Lease duration, in seconds.")
	fs.Var(&w.results, "result", "A result to write to the ConfigMap; repeat for several writes, with --work between them.")
	fs.DurationVar(&w.work, "work", 0, "How long the worker computes between two writes.")
	fs.BoolVar(&w.release, "release", false, "Release the grant after the last write.")
	fs.DurationVar(&w.timeout, "timeout", 2*time.Minute, "Give up after this long.")
	fs.BoolVar(&w.gated, "gated", false, "Run in a lock-gated Pod: write under the grant named by $LOCKWARDEN_GRANT, $LOCKWARDEN_FENCE and $LOCKWARDEN_FENCED_RESOURCE instead of acquiring.")
	fs.StringVar(&w.readyAddr, "ready-addr", "", "Answer readiness probes (GET /readyz) on this address, from the worker's own process.")
	fs.BoolVar(&w.finishOnTerm, "finish-on-term", false, "On SIGTERM, report it and finish the writes instead of stopping.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr)))

	stopSignals := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if w.finishOnTerm {
		stopSignals = stopSignals[:1]
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() {
			for range term {
				w.emit(Event{Event: EventTerminating})
			}
		}()
	}
	if w.readyAddr != "" {
		ln, err := net.Listen("tcp", w.readyAddr)
		if err != nil {
			w.emit(Event{Event: EventFailed, Detail: err.Error()})
			return 1
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
		go func() { _ = (&http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}).Serve(ln) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	if err := w.run(ctx); err != nil {
		w.emit(Event{Event: EventFailed, Detail: err.Error()})
		return 1
	}
	if w.gated && w.refused {
		// Its work did not land: the Pod fails, so that its Job runs
		// the work again under a new grant.
		return 3
	}
	return 0
}

func (w *worker) run(ctx context.Context) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", w.kubeconfig)
	if err != nil {
		return err
	}
	if w.c, err = client.NewWithWatch(cfg, client.Options{Scheme: newScheme()}); err != nil {
		return err
	}
	acquire := w.acquire
	if w.gated {
		acquire = w.podGrant
	}
	grant, err := acquire(ctx)
	if err != nil {
		return err
	}
	for i, result := range w.results {
		if i > 0 {
			w.emit(Event{Event: EventComputing, Detail: w.work.String()})
			if err := sleep(ctx, w.work); err != nil {
				return err
			}
		}
		accepted, err := w.write(ctx, grant, result)
		if err != nil {
			return err
		}
		if !accepted {
			w.refused = true
			// Refused: this worker no longer owns the resource, so it
			// produces no further effect.
			return nil
		}
	}
	if w.release {
		return w.releaseGrant(ctx, grant)
	}
	return nil
}

// acquire creates the worker's LockGrant and waits, watching it, until the
// controller grants it.
func (w *worker) acquire(ctx context.Context) (*lockingv1alpha1.LockGrant, error) {
	prefix := "settlement-" + strings.ToLower(w.actor) + "-"
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix, Namespace: w.namespace},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             w.resource,
			LeaseDurationSeconds: int32(w.ttlSeconds),
			RequestID:            prefix + strconv.FormatInt(time.Now().UnixNano(), 36),
		},
	}
	requested := time.Now()
	if err := w.c.Create(ctx, g); err != nil {
		return nil, fmt.Errorf("creating LockGrant: %w", err)
	}
	w.emit(Event{Time: requested, Event: EventRequested, Detail: g.Name})
	held, err := waitHeld(ctx, w.c, g)
	if err != nil {
		return nil, err
	}
	w.fence = held.Status.FenceToken
	w.emit(Event{Event: EventHeld, Detail: held.Name})
	return held, nil
}

// podGrant reads the grant the manager requested for the worker's lock-gated
// Pod from the environment the Pod's downward API filled in.
func (w *worker) podGrant(context.Context) (*lockingv1alpha1.LockGrant, error) {
	name, resource := os.Getenv("LOCKWARDEN_GRANT"), os.Getenv("LOCKWARDEN_FENCED_RESOURCE")
	if name == "" || resource == "" {
		return nil, fmt.Errorf("no lock-gated Pod's grant: LOCKWARDEN_GRANT %q, LOCKWARDEN_FENCED_RESOURCE %q", name, resource)
	}
	fence, err := fencing.ParseFence(os.Getenv("LOCKWARDEN_FENCE"))
	if err != nil {
		return nil, fmt.Errorf("the lock-gated Pod's LOCKWARDEN_FENCE: %w", err)
	}
	w.fence, w.resource = fence, resource
	w.emit(Event{Event: EventHeld, Detail: name})
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: w.namespace, Name: name}}
	g.Status.FenceToken = fence
	return g, nil
}

// waitHeld watches grant g until it is Held, and fails if it ends first.
func waitHeld(ctx context.Context, c client.WithWatch, g *lockingv1alpha1.LockGrant) (*lockingv1alpha1.LockGrant, error) {
	for {
		// Without a resourceVersion the watch starts with the grant's
		// current state, so nothing between Create and Watch is missed.
		wi, err := c.Watch(ctx, &lockingv1alpha1.LockGrantList{}, client.InNamespace(g.Namespace), client.MatchingFields{"metadata.name": g.Name})
		if err != nil {
			return nil, fmt.Errorf("watching LockGrant %s: %w", g.Name, err)
		}
		got, err := untilHeld(ctx, wi)
		wi.Stop()
		if got != nil || err != nil {
			return got, err
		}
		// The watch ended early: watch again.
	}
}

func untilHeld(ctx context.Context, wi watch.Interface) (*lockingv1alpha1.LockGrant, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the grant: %w", ctx.Err())
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return nil, nil
			}
			switch ev.Type {
			case watch.Error:
				return nil, nil
			case watch.Deleted:
				return nil, errors.New("the grant was deleted before it was held")
			}
			g, ok := ev.Object.(*lockingv1alpha1.LockGrant)
			if !ok {
				continue
			}
			switch {
			case g.Status.Phase == lockingv1alpha1.PhaseHeld && g.Status.FenceToken > 0:
				return g, nil
			case g.Status.Phase.Final():
				return nil, fmt.Errorf("the grant ended as %s before it was held", g.Status.Phase)
			}
		}
	}
}

// write stores result in the guarded ConfigMap under the grant's fence:
// create when absent, else read-modify-write. It reports whether admission
// accepted it; a refusal is not an error.
func (w *worker) write(ctx context.Context, g *lockingv1alpha1.LockGrant, result string) (bool, error) {
	key := client.ObjectKey{Namespace: w.namespace, Name: w.configMap}
	var op string
	err := retry.OnError(retry.DefaultRetry, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error {
		cm := &corev1.ConfigMap{}
		switch err := w.c.Get(ctx, key, cm); {
		case apierrors.IsNotFound(err):
			op = "create"
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: key.Name, Namespace: key.Namespace,
				Labels:      map[string]string{lockingv1alpha1.GuardedLabel: "true"},
				Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: w.resource},
			}}
			stamp(cm, g, result)
			return w.c.Create(ctx, cm)
		case err != nil:
			return err
		}
		op = "update"
		stamp(cm, g, result)
		return w.c.Update(ctx, cm)
	})
	if err == nil {
		w.emit(Event{Event: EventWriteAccepted, Op: op, Detail: result})
		return true, nil
	}
	if reason, msg, ok := admissionDenial(err); ok {
		w.emit(Event{Event: EventWriteRejected, Op: op, Reason: reason, Detail: msg})
		return false, nil
	}
	return false, fmt.Errorf("%s ConfigMap %s: %w", op, key, err)
}

// stamp sets the result and the write's grant and fence on cm.
func stamp(cm *corev1.ConfigMap, g *lockingv1alpha1.LockGrant, result string) {
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[lockingv1alpha1.GrantAnnotation] = g.Name
	cm.Annotations[lockingv1alpha1.FenceAnnotation] = fencing.FormatFence(g.Status.FenceToken)
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data["result"] = result
}

// releaseGrant sets spec.release on the worker's grant.
func (w *worker) releaseGrant(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &lockingv1alpha1.LockGrant{}
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			return err
		}
		cur.Spec.Release = true
		return w.c.Update(ctx, cur)
	})
	if err != nil {
		return fmt.Errorf("releasing LockGrant %s: %w", g.Name, err)
	}
	w.emit(Event{Event: EventReleased, Detail: g.Name})
	return nil
}

// emit prints e as one JSON line, stamped with the actor, the fence and,
// unless set, the time.
func (w *worker) emit(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	e.Actor, e.Fence = w.actor, w.fence
	_ = w.out.Encode(e)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
