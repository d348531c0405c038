package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/examples/fenced-controller/counter"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/election"
)

// Two replicas of the example operator, each a controller-runtime manager
// wired by setup exactly as main does, run against a real kube-apiserver
// and etcd with lockwarden's controller and webhooks in this process on the
// real clock.

var env *envtest.Env

func TestMain(m *testing.M) {
	envtest.Main(m, envtest.Suite{
		Setup: func(ctx context.Context, e *envtest.Env) error {
			env = e
			return e.GrantUsersAccess(ctx)
		},
		// With the control plane stopped, no goroutine of a replica may be left.
		FindLeaks: true,
	})
}

// freezer stands for a process that stops (SIGSTOP, a long GC pause, a
// frozen VM): while frozen, every write of the replica blocks where it is,
// the elector's renewals and the controller's writes alike, and goes out
// when it thaws. A controller write caught by the freeze was already on
// its way: it goes out even though its context was cancelled meanwhile
// (the worst case, a request already in the socket). The replica's reads go on, as a partition that drops
// writes would have it.
type freezer struct {
	mu     sync.Mutex
	frozen chan struct{} // closed at thaw; nil while running
	since  bool          // frozen at least once: record the writer's writes
	// writes are the outcomes of the controller's writes sent since the
	// first freeze; blocked counts those that waited.
	writes  []error
	blocked int
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frozen, f.since = make(chan struct{}), true
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.frozen)
	f.frozen = nil
}

// gate blocks while frozen; writer says the write is the controller's.
// It reports whether the write started after the first freeze, and
// whether it waited.
func (f *freezer) gate(writer bool) (since, waited bool) {
	f.mu.Lock()
	ch, since := f.frozen, f.since
	if ch != nil && writer {
		f.blocked++
	}
	f.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return since, ch != nil
}

// record keeps the outcome of a write that started after the first freeze.
func (f *freezer) record(since bool, err error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if since {
		f.writes = append(f.writes, err)
	}
	return err
}

func (f *freezer) state() (blocked int, writes []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked, slices.Clone(f.writes)
}

// frozenWriter is the manager's client of a replica under a freezer.
type frozenWriter struct {
	client.Client
	f *freezer
}

func (c *frozenWriter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	since, waited := c.f.gate(true)
	if waited {
		ctx = context.WithoutCancel(ctx)
	}
	return c.f.record(since, c.Client.Create(ctx, obj, opts...))
}

func (c *frozenWriter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	since, waited := c.f.gate(true)
	if waited {
		ctx = context.WithoutCancel(ctx)
	}
	return c.f.record(since, c.Client.Update(ctx, obj, opts...))
}

func (c *frozenWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	since, waited := c.f.gate(true)
	if waited {
		ctx = context.WithoutCancel(ctx)
	}
	return c.f.record(since, c.Client.Patch(ctx, obj, patch, opts...))
}

func (c *frozenWriter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	since, waited := c.f.gate(true)
	if waited {
		ctx = context.WithoutCancel(ctx)
	}
	return c.f.record(since, c.Client.Delete(ctx, obj, opts...))
}

// frozenElector is the elector's direct client of a replica under a
// freezer: its renewals and releases block while frozen.
type frozenElector struct {
	client.WithWatch
	f *freezer
}

func (c *frozenElector) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	_, _ = c.f.gate(false)
	return c.WithWatch.Create(ctx, obj, opts...)
}

func (c *frozenElector) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	_, _ = c.f.gate(false)
	return c.WithWatch.Update(ctx, obj, opts...)
}

func (c *frozenElector) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	_, _ = c.f.gate(false)
	return c.WithWatch.Patch(ctx, obj, patch, opts...)
}

// replica is one running manager of the example operator.
type replica struct {
	id     string
	f      *freezer
	e      *election.Elector
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	terms   []*election.Term
	started []time.Time
	stopped int
	leaders []string
}

const (
	resource = "controllers/fenced-controller"
	object   = "counter"
)

// startReplica runs a replica named id in ns as service account
// ops/counter (both replicas share it, as the Pods of one Deployment do).
func startReplica(t *testing.T, ns, id string) *replica {
	t.Helper()
	r := &replica{id: id, f: &freezer{}, done: make(chan struct{})}
	rc := rest.CopyConfig(env.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:ops:counter", Groups: []string{"system:serviceaccounts"}}
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme:         env.Scheme,
		LeaderElection: false,
		Metrics:        metricsserver.Options{BindAddress: "0"},
		Cache:          cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		NewClient: func(cfg *rest.Config, o client.Options) (client.Client, error) {
			c, err := client.New(cfg, o)
			return &frozenWriter{Client: c, f: r.f}, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := client.NewWithWatch(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	o := options{namespace: ns, identity: id, resource: resource, configMap: object, lease: 3 * time.Second, interval: 100 * time.Millisecond,
		callbacks: election.Callbacks{
			OnStartedLeading: func(_ context.Context, term *election.Term) {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.terms, r.started = append(r.terms, term), append(r.started, time.Now())
			},
			OnStoppedLeading: func() {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.stopped++
			},
			OnNewLeader: func(leader string) {
				r.mu.Lock()
				defer r.mu.Unlock()
				r.leaders = append(r.leaders, leader)
			},
		}}
	if r.e, err = setup(mgr, &frozenElector{WithWatch: direct, f: r.f}, o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager %s: %v", id, err)
		}
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *replica) stop() {
	r.f.mu.Lock()
	if r.f.frozen != nil {
		close(r.f.frozen)
		r.f.frozen = nil
	}
	r.f.mu.Unlock()
	r.cancel()
	<-r.done
}

// term returns the i-th term and when it started, or nil.
func (r *replica) term(i int) (*election.Term, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < len(r.terms) {
		return r.terms[i], r.started[i]
	}
	return nil, time.Time{}
}

func (r *replica) lastLeader() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.leaders) == 0 {
		return ""
	}
	return r.leaders[len(r.leaders)-1]
}

func (r *replica) stoppedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("never: %s", what)
	}
}

func waitTerm(t *testing.T, r *replica, i int) (*election.Term, time.Time) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s starts term %d", r.id, i+1), func() bool { tm, _ := r.term(i); return tm != nil })
	return r.term(i)
}

// counterOf reads the counter ConfigMap as admin: its count, writer and
// accepted fence.
func counterOf(t *testing.T, ns string) (count int64, writer string, fence string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := env.Admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: object}, cm); err != nil {
		return 0, "", ""
	}
	n, _ := strconv.ParseInt(cm.Data[counter.CountKey], 10, 64)
	return n, cm.Data[counter.WriterKey], cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation]
}

// waitWrites waits until the counter has moved at least twice under
// writer with fence.
func waitWrites(t *testing.T, ns, writer string, fence int64) {
	t.Helper()
	var first int64 = -1
	eventually(t, fmt.Sprintf("%s raises the counter under fence %d", writer, fence), func() bool {
		n, w, f := counterOf(t, ns)
		if w != writer || f != fencing.FormatFence(fence) {
			return false
		}
		if first < 0 {
			first = n
		}
		return n >= first+2
	})
}

// The leader replica freezes past its lease in the middle of a write; the
// other replica takes over with a larger fence and carries on; the frozen
// replica's leader context is cancelled and its term ends; when it thaws,
// the write it had stamped before the freeze goes out and is refused, and
// nothing it sends lands. It then queues again and leads once more after
// the second replica stops.
func TestDeposedLeaderIsFenced(t *testing.T) {
	ns, err := env.Namespace(t.Context(), "fenced")
	if err != nil {
		t.Fatal(err)
	}
	a := startReplica(t, ns, "replica-a")
	ta, _ := waitTerm(t, a, 0)
	waitWrites(t, ns, "replica-a", ta.Fence())

	b := startReplica(t, ns, "replica-b")
	eventually(t, "replica-b reports replica-a as the leader", func() bool { return b.lastLeader() == "replica-a" })
	if b.e.IsLeader() {
		t.Fatal("replica-b leads beside replica-a")
	}

	frozenAt := time.Now()
	a.f.freeze()
	eventually(t, "replica-a's controller is stopped inside a stamped write", func() bool { n, _ := a.f.state(); return n >= 1 })

	// While frozen, replica-a's local deadline passes without a renewal:
	// its leader context is cancelled before its successor is granted.
	eventually(t, "replica-a's leader context is cancelled", func() bool { return ta.Context().Err() != nil })
	if cause := context.Cause(ta.Context()); !errors.Is(cause, lock.ErrOwnershipUnknown) && !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("replica-a's leader context ended with %v; want ownership unknown or lost", cause)
	}
	if a.e.IsLeader() {
		t.Fatal("replica-a still reports leading after its term ended")
	}
	tb, startedB := waitTerm(t, b, 0)
	t.Logf("failover: replica-a frozen -> replica-b's OnStartedLeading in %s (lease %s)", startedB.Sub(frozenAt), 3*time.Second)
	if tb.Fence() <= ta.Fence() {
		t.Fatalf("replica-b's fence %d is not larger than replica-a's %d", tb.Fence(), ta.Fence())
	}
	waitWrites(t, ns, "replica-b", tb.Fence())

	a.f.thaw()
	eventually(t, "replica-a's term is over (OnStoppedLeading)", func() bool { return a.stoppedCount() == 1 })
	eventually(t, "replica-a queues again and reports replica-b as the leader", func() bool { return a.lastLeader() == "replica-b" })
	_, writes := a.f.state()
	if len(writes) == 0 {
		t.Fatal("replica-a's stamped write never went out after the thaw")
	}
	for i, err := range writes {
		ref := lock.Refusal(err)
		if ref == nil || !slices.Contains([]fencing.Reason{fencing.ReasonStaleOwner, fencing.ReasonExpired, fencing.ReasonNotHeld,
			fencing.ReasonAlreadyEnded, fencing.ReasonUnknownGrant}, ref.Reason) {
			t.Fatalf("replica-a's write %d after its term: %v; want a refusal of a stale claim", i+1, err)
		}
		t.Logf("replica-a's write %d after its term: %s", i+1, ref.Reason)
	}
	if _, w, f := counterOf(t, ns); w != "replica-b" || f != fencing.FormatFence(tb.Fence()) {
		t.Fatalf("after replica-a thawed the counter was last written by %s under fence %s", w, f)
	}
	waitWrites(t, ns, "replica-b", tb.Fence())

	// replica-b stops: it releases its term, and replica-a, queued again,
	// leads with a larger fence.
	b.stop()
	ta2, _ := waitTerm(t, a, 1)
	if ta2.Fence() <= tb.Fence() {
		t.Fatalf("replica-a's second term has fence %d, not larger than replica-b's %d", ta2.Fence(), tb.Fence())
	}
	waitWrites(t, ns, "replica-a", ta2.Fence())
}
