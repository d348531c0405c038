package lock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// newClient returns a direct (uncached) client for the cluster in
// $KUBECONFIG that knows lockwarden's types.
func newClient() (client.WithWatch, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := lockingv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: s})
}

// Take a lock, do the work under its context, release it.
func ExampleClient_Acquire() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/nightly-report", lock.WithTTL(30*time.Second), lock.WithWait(time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("state:", h.State(), "fence:", h.Info().Fence)

	// The work runs under h.Context(): it is cancelled the moment the
	// holder can no longer prove it holds the lock.
	work := h.Context()
	select {
	case <-work.Done():
		fmt.Println("lost:", context.Cause(work))
	default:
		fmt.Println("working")
	}

	err = h.Release(context.WithoutCancel(ctx))
	fmt.Println("release:", err)
	// Output:
	// state: HELD fence: 1
	// working
	// release: <nil>
}

// Stamp puts the grant and fence on a guarded object, so the admission
// webhook can refuse the write if a newer holder exists.
func ExampleHandle_Stamp() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/settlement")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Release(context.WithoutCancel(ctx)) //nolint:errcheck // example

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "settlement-result"},
		Data:       map[string]string{"total": "42"},
	}
	if err := h.Stamp(cm); err != nil {
		fmt.Println("not holding:", err)
		return
	}
	if err := c.Create(h.Context(), cm); err != nil {
		fmt.Println("refused:", err)
		return
	}
	// Admission consumed the claim and recorded what it accepted.
	fmt.Println("guarded:", cm.Labels[lockingv1alpha1.GuardedLabel], "fence:", cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation])
	// Output:
	// guarded: true fence: 1
}

// Write a guarded object under the lock: create it when it does not exist
// yet, update it otherwise, and stamp every attempt anew (admission consumes
// each write's claim, so a retry after a conflict needs its own). This is the
// Go example of docs/go-library.md; it needs a cluster, so it is compiled but not run.
func ExampleHandle_Stamp_createOrUpdate() {
	ctx := context.Background()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		fmt.Println(err)
		return
	}
	if err := lockingv1alpha1.AddToScheme(s); err != nil {
		fmt.Println(err)
		return
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg, err = lock.ConfigureTransport(cfg) // notice a dead connection within about 2 s
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: s})
	if err != nil {
		fmt.Println(err)
		return
	}

	locks := lock.NewClient(c, lock.WithNamespace("billing"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "invoice-batch/2026-07-19", lock.WithTTL(30*time.Second), lock.WithWait(time.Minute))
	if err != nil {
		fmt.Println("not acquired:", err) // lock.ErrWaitTimeout after the wait, ctx.Err(), ...
		return
	}
	defer h.Release(context.WithoutCancel(ctx)) //nolint:errcheck // example

	key := types.NamespacedName{Namespace: "billing", Name: "settlement-2026-07-19"}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm := &corev1.ConfigMap{}
		err := c.Get(h.Context(), key, cm)
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		cm.Namespace, cm.Name = key.Namespace, key.Name
		cm.Data = map[string]string{"state": "settled"}
		// This write's claim: grant, fence, proof and a fresh write ID. An
		// error means the holder may not start an effect now.
		if err := h.Stamp(cm); err != nil {
			return err
		}
		// h.Context() is cancelled as soon as ownership is in doubt.
		if exists {
			return c.Update(h.Context(), cm)
		}
		return c.Create(h.Context(), cm)
	})
	if err != nil {
		// A refusal names its reason: errors.Is(denial.Wrap(err), fencing.ErrStaleOwner), ...
		fmt.Println("not written:", err)
		return
	}
	fmt.Println("written under fence", h.Info().Fence)
}

// The handle's Context is the one signal that the lock is over: derive the
// work's contexts from it, and read why it ended with context.Cause.
func ExampleHandle_Context() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/context")
	if err != nil {
		fmt.Println(err)
		return
	}
	work, cancel := context.WithTimeout(h.Context(), time.Minute)
	defer cancel()
	fmt.Println("while held:", context.Cause(h.Context()))

	_ = h.Release(context.WithoutCancel(ctx))
	<-work.Done() // the work's context ends with the handle's
	cause := context.Cause(h.Context())
	fmt.Println("after release:", cause, errors.Is(cause, lock.ErrReleased))
	// Output:
	// while held: <nil>
	// after release: lock: released true
}

// Check judges now whether the holder may act, and how long it may: bound
// an operation that no enforcement point checks by the time left.
func ExampleHandle_Check() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/check", lock.WithTTL(30*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Release(context.WithoutCancel(ctx)) //nolint:errcheck // example

	left, err := h.Check()
	if err != nil {
		fmt.Println("may not act:", err)
		return
	}
	op, cancel := context.WithTimeout(h.Context(), left) // e.g. a statement timeout
	defer cancel()
	deadline, _ := op.Deadline()
	fmt.Println("bounded within the lease:", time.Until(deadline) <= 30*time.Second)
	// Output:
	// bounded within the lease: true
}

// Info is the acquisition's identity and fence, constant once Acquire
// returned: what a holder logs and passes on.
func ExampleHandle_Info() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/info", lock.WithRequestID("nightly-2026-07-19"), lock.WithTTL(20*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Release(context.WithoutCancel(ctx)) //nolint:errcheck // example
	info := h.Info()
	fmt.Println("resource:", info.Resource, "fenced:", info.FencedResource, "fence:", info.Fence)
	fmt.Println("request:", info.RequestID, "ttl:", info.TTL, "grant in:", info.Grant.Namespace)
	// Output:
	// resource: example/info fenced: example/info fence: 1
	// request: nightly-2026-07-19 ttl: 20s grant in: default
}

// TryAcquire does not wait in the queue.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	first, err := locks.TryAcquire(ctx, "example/compaction")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = locks.TryAcquire(ctx, "example/compaction")
	fmt.Println("second try busy:", errors.Is(err, lock.ErrBusy))
	fmt.Println("released:", first.Release(ctx) == nil)
	// Output:
	// second try busy: true
	// released: true
}

// NextSegment numbers the steps of a long operation under one fence, for a
// store that checks fence, operation root and sequence together.
func ExampleHandle_NextSegment() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/migration",
		lock.WithOperationRoot("sha256:5f9c4ab08cac7457e9111a30e4664920607ea2c115a1433d7be98e97e64244ca"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer h.Release(context.WithoutCancel(ctx)) //nolint:errcheck // example
	for range 3 {
		seg, err := h.NextSegment()
		if err != nil {
			fmt.Println("stop:", err)
			return
		}
		// A segment store checks seg.Fencing(payload) with
		// fencing.CheckSegment in the transaction that applies it.
		fs := seg.Fencing([]byte(fmt.Sprintf("batch %d", seg.Seq)))
		fmt.Println("fence", fs.Fence, "segment", fs.Seq, "of", fs.Root[:15], "digest", fs.Digest[:15])
	}
	// Output:
	// fence 1 segment 1 of sha256:5f9c4ab0 digest sha256:e8dd3d6e
	// fence 1 segment 2 of sha256:5f9c4ab0 digest sha256:96038c72
	// fence 1 segment 3 of sha256:5f9c4ab0 digest sha256:2cfd5c25
}

// WatchTransitions follows the grants of a namespace as they change phase.
func ExampleWatchTransitions() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	h, err := locks.Acquire(ctx, "example/watched")
	if err != nil {
		fmt.Println(err)
		return
	}
	err = lock.WatchTransitions(ctx, c, func(tr lock.Transition) error {
		if tr.Grant.Spec.Resource != "example/watched" {
			return nil
		}
		fmt.Println(tr.Grant.Spec.Resource, "->", tr.To, "fence", tr.Grant.Status.FenceToken)
		switch tr.To {
		case lockingv1alpha1.PhaseHeld:
			_ = h.Release(ctx) // the next transition: Released
		case lockingv1alpha1.PhaseReleased:
			return errors.New("done")
		}
		return nil
	}, client.InNamespace("default"))
	fmt.Println(err)
	// Output:
	// example/watched -> Held fence 1
	// example/watched -> Released fence 1
	// done
}

// holderBoard is an example controller that reacts to grant transitions: it
// keeps a ConfigMap "lock-holders" in each namespace that names, per
// resource, the grant that holds it and its fence. It is woken only when a
// grant changes phase or fence (lock.PhaseChanged), never by renewals.
type holderBoard struct {
	client.Client
}

func (r *holderBoard) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var grants lockingv1alpha1.LockGrantList
	if err := r.List(ctx, &grants, client.InNamespace(req.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	board := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: req.Namespace, Name: "lock-holders"}}
	_, err := ctrl.CreateOrUpdate(ctx, r.Client, board, func() error {
		board.Data = map[string]string{}
		for _, g := range grants.Items {
			if g.Status.Phase == lockingv1alpha1.PhaseHeld {
				// ConfigMap keys cannot contain "/".
				board.Data[lockingv1alpha1.FenceCounterName(g.Spec.Resource)] = fmt.Sprintf("%s %s fence=%d", g.Spec.Resource, g.Spec.Owner, g.Status.FenceToken)
			}
		}
		return nil
	})
	return reconcile.Result{}, err
}

// An example controller consuming grant status: it is triggered by grant
// transitions only, through the lock.PhaseChanged predicate.
func Example_controller() {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = lockingv1alpha1.AddToScheme(s)
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{Scheme: s})
	if err != nil {
		panic(err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("holder-board").
		For(&lockingv1alpha1.LockGrant{}, builder.WithPredicates(lock.PhaseChanged())).
		Complete(&holderBoard{Client: mgr.GetClient()})
	if err != nil {
		panic(err)
	}
	_ = mgr.Start(ctrl.SetupSignalHandler())
}

// Hold one of several permits of a resource: two holders at once, each in
// its own slot with its own fence sequence; a third would wait. Writes are
// bound to the holder's slot (FencedResource), so every fencing rule of an
// exclusive lock holds per slot.
func ExampleWithPermits() {
	ctx := context.Background()
	c, err := newClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	locks := lock.NewClient(c, lock.WithNamespace("default"))
	defer locks.Close(context.WithoutCancel(ctx)) //nolint:errcheck // example
	var held []*lock.Handle
	for range 2 {
		h, err := locks.Acquire(ctx, "example/render-farm", lock.WithPermits(2))
		if err != nil {
			fmt.Println(err)
			return
		}
		defer h.Release(context.WithoutCancel(ctx)) //nolint:errcheck // example
		held = append(held, h)
		info := h.Info()
		fmt.Println("permit:", info.Permit, "fence:", info.Fence, "fenced resource:", info.FencedResource)
	}
	_, err = locks.TryAcquire(ctx, "example/render-farm", lock.WithPermits(2))
	fmt.Println("third:", err)

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "render-farm-slot-1"}}
	if err := held[1].Stamp(cm); err != nil {
		fmt.Println("not holding:", err)
		return
	}
	fmt.Println("bound to:", cm.Annotations[lockingv1alpha1.ResourceAnnotation])
	// Output:
	// permit: 0 fence: 1 fenced resource: example/render-farm
	// permit: 1 fence: 1 fenced resource: example/render-farm#1
	// third: lock: the resource is held by another grant
	// bound to: example/render-farm#1
}
