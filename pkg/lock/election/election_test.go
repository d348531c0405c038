package election_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/election"
)

// candidate is one elector under test and what its callbacks saw.
type candidate struct {
	e      *election.Elector
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	terms   []*election.Term
	stopped int
	leaders []string
}

// startCandidate runs an elector for resource in ns as identity with c.
// work runs each term (default: until the leader context ends). The elector
// is stopped when the test ends.
func startCandidate(t *testing.T, c client.WithWatch, ns, resource, identity string, cfg election.Config, work func(context.Context, *election.Term)) *candidate {
	t.Helper()
	if work == nil {
		work = func(ctx context.Context, _ *election.Term) { <-ctx.Done() }
	}
	cd := &candidate{done: make(chan struct{})}
	cfg.Client, cfg.Namespace, cfg.Resource, cfg.Identity = c, ns, resource, identity
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 3 * time.Second
	}
	cfg.Callbacks = election.Callbacks{
		OnStartedLeading: func(ctx context.Context, term *election.Term) {
			cd.mu.Lock()
			cd.terms = append(cd.terms, term)
			cd.mu.Unlock()
			work(ctx, term)
		},
		OnStoppedLeading: func() {
			cd.mu.Lock()
			cd.stopped++
			cd.mu.Unlock()
		},
		OnNewLeader: func(id string) {
			cd.mu.Lock()
			cd.leaders = append(cd.leaders, id)
			cd.mu.Unlock()
		},
	}
	e, err := election.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cd.e = e
	ctx, cancel := context.WithCancel(context.Background())
	cd.cancel = cancel
	go func() {
		defer close(cd.done)
		if err := e.Run(ctx); err != nil {
			t.Errorf("Run of %s: %v", identity, err)
		}
	}()
	t.Cleanup(cd.stop)
	return cd
}

// stop ends Run and waits for it.
func (cd *candidate) stop() {
	cd.cancel()
	<-cd.done
}

// term returns the i-th term (0-based), or nil.
func (cd *candidate) term(i int) *election.Term {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	if i < len(cd.terms) {
		return cd.terms[i]
	}
	return nil
}

func (cd *candidate) stoppedCount() int {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	return cd.stopped
}

func (cd *candidate) sawLeader(id string) bool {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	return slices.Contains(cd.leaders, id)
}

func (cd *candidate) lastLeader() string {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	if len(cd.leaders) == 0 {
		return ""
	}
	return cd.leaders[len(cd.leaders)-1]
}

// waitTerm waits for the i-th term of cd.
func waitTerm(t *testing.T, cd *candidate, i int) *election.Term {
	t.Helper()
	eventually(t, "the candidate leads", func() bool { return cd.term(i) != nil })
	return cd.term(i)
}

// Bad configurations are refused before anything is sent, with a reason
// code first.
func TestConfigRefused(t *testing.T) {
	ok := election.Config{Client: as(t, "cfg"), Resource: "controllers/cfg", Identity: "a",
		Callbacks: election.Callbacks{OnStartedLeading: func(context.Context, *election.Term) {}}}
	for name, mod := range map[string]func(*election.Config){
		"no client":           func(c *election.Config) { c.Client = nil },
		"bad resource":        func(c *election.Config) { c.Resource = "Not A Resource" },
		"no identity":         func(c *election.Config) { c.Identity = "" },
		"fractional lease":    func(c *election.Config) { c.LeaseDuration = 1500 * time.Millisecond },
		"lease over an hour":  func(c *election.Config) { c.LeaseDuration = 2 * time.Hour },
		"no OnStartedLeading": func(c *election.Config) { c.Callbacks.OnStartedLeading = nil },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ok
			mod(&cfg)
			_, err := election.New(cfg)
			if !errors.Is(err, lock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "INVALID_SPEC: ") {
				t.Fatalf("New = %v; want INVALID_SPEC matching lock.ErrInvalidOption", err)
			}
		})
	}
	if _, err := election.New(ok); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
}

// Two candidates of one identity (two replicas): one leads, the other
// reports it as leader and waits; when the leader stops, its leader
// context is cancelled, OnStoppedLeading runs, its grant is released, and
// the other leads at once with a larger fence.
func TestTermsHandOverWithLargerFences(t *testing.T) {
	ns := namespace(t)
	const res = "controllers/handover"
	a := startCandidate(t, as(t, "operator"), ns, res, "replica-a", election.Config{LeaseDuration: 30 * time.Second}, nil)
	ta := waitTerm(t, a, 0)
	if !a.e.IsLeader() || a.e.Fence() != ta.Fence() || ta.Fence() < 1 || ta.Identity() != "replica-a" {
		t.Fatalf("leader a: IsLeader %v, Fence %d, term fence %d", a.e.IsLeader(), a.e.Fence(), ta.Fence())
	}
	g := &lockingv1alpha1.LockGrant{}
	if err := env.Admin.Get(t.Context(), ta.Grant(), g); err != nil || g.Annotations[election.IdentityAnnotation] != "replica-a" || g.Spec.Resource != res {
		t.Fatalf("term grant %v: annotations %v, resource %q", err, g.Annotations, g.Spec.Resource)
	}

	b := startCandidate(t, as(t, "operator"), ns, res, "replica-b", election.Config{LeaseDuration: 30 * time.Second}, nil)
	eventually(t, "b reports a as the leader", func() bool { return b.sawLeader("replica-a") })
	if b.e.IsLeader() || b.e.Fence() != 0 || b.term(0) != nil {
		t.Fatalf("follower b: IsLeader %v, Fence %d", b.e.IsLeader(), b.e.Fence())
	}

	start := time.Now()
	a.stop()
	if !closed(ta.Context().Done()) || !errors.Is(context.Cause(ta.Context()), context.Canceled) {
		t.Fatalf("a's leader context after Run ended: cause %v", context.Cause(ta.Context()))
	}
	if a.stoppedCount() != 1 || a.e.IsLeader() || a.e.Fence() != 0 {
		t.Fatalf("a after stopping: OnStoppedLeading %d times, IsLeader %v, Fence %d", a.stoppedCount(), a.e.IsLeader(), a.e.Fence())
	}
	if err := env.Admin.Get(t.Context(), ta.Grant(), g); err != nil || g.Status.Phase != lockingv1alpha1.PhaseReleased {
		t.Fatalf("a's grant after stopping: %v, phase %s; want Released", err, g.Status.Phase)
	}
	tb := waitTerm(t, b, 0)
	t.Logf("handover on release: %s", time.Since(start))
	if tb.Fence() <= ta.Fence() || !b.e.IsLeader() {
		t.Fatalf("b's term fence %d after a's %d, IsLeader %v", tb.Fence(), ta.Fence(), b.e.IsLeader())
	}
	eventually(t, "b reports itself as the leader", func() bool { return b.lastLeader() == "replica-b" })
}

// The stamping client fences every write to a guarded object with the
// term's claim (create, update, merge patch, JSON patch, delete), leaves
// unguarded objects alone, and once the term is over fails before
// sending; a write stamped during the term and sent after it is refused
// by admission.
func TestStampingClient(t *testing.T) {
	ns := namespace(t)
	c := as(t, "writer")
	a := startCandidate(t, c, ns, "controllers/stamping", "a", election.Config{LeaseDuration: 30 * time.Second}, nil)
	term := waitTerm(t, a, 0)
	w := term.Client(c)
	ctx := t.Context()

	accepted := func(name string) *corev1.ConfigMap {
		t.Helper()
		got := &corev1.ConfigMap{}
		if err := env.Admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if f := got.Annotations[lockingv1alpha1.AcceptedFenceAnnotation]; f != fencing.FormatFence(term.Fence()) {
			t.Fatalf("%s: accepted fence %q, want %d (annotations %v)", name, f, term.Fence(), got.Annotations)
		}
		if _, left := got.Annotations[lockingv1alpha1.FenceAnnotation]; left {
			t.Fatalf("%s: the claim outlived its write: %v", name, got.Annotations)
		}
		return got
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "state",
		Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"}}, Data: map[string]string{"v": "1"}}
	if err := w.Create(ctx, cm); err != nil {
		t.Fatalf("create: %v", err)
	}
	accepted("state")
	cm.Data["v"] = "2"
	if err := w.Update(ctx, cm); err != nil {
		t.Fatalf("update: %v", err)
	}
	accepted("state")
	base := cm.DeepCopy()
	cm.Data["v"] = "3"
	if err := w.Patch(ctx, cm, client.MergeFrom(base)); err != nil {
		t.Fatalf("merge patch: %v", err)
	}
	if got := accepted("state"); got.Data["v"] != "3" {
		t.Fatalf("after the merge patch: %v", got.Data)
	}
	if err := w.Patch(ctx, cm, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"add","path":"/data/w","value":"4"}]`))); err != nil {
		t.Fatalf("JSON patch: %v", err)
	}
	if got := accepted("state"); got.Data["w"] != "4" {
		t.Fatalf("after the JSON patch: %v", got.Data)
	}
	// The same merge patch without the wrapper carries no claim.
	if err := c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(`{"data":{"v":"unfenced"}}`))); fencing.ReasonOf(lock.Refusal(err)) != fencing.ReasonNoFence {
		t.Fatalf("an unstamped patch: %v, want NO_FENCE", err)
	}

	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}, Data: map[string]string{"v": "1"}}
	if err := w.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if plain.Labels[lockingv1alpha1.GuardedLabel] != "" || plain.Annotations[lockingv1alpha1.GrantAnnotation] != "" {
		t.Fatalf("an unguarded object was stamped: labels %v, annotations %v", plain.Labels, plain.Annotations)
	}
	if err := w.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}}); err != nil {
		t.Fatalf("delete of an unguarded object: %v", err)
	}

	if err := w.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "state"}}); err != nil {
		t.Fatalf("fenced delete: %v", err)
	}
	if err := env.Admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "state"}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the fenced delete: %v", err)
	}

	// A write stamped during the term, held back, and sent after it ended.
	late := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "late",
		Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"}}, Data: map[string]string{"v": "1"}}
	if err := w.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	held := late.DeepCopy()
	held.Data["v"] = "late"
	if err := term.Stamp(held); err != nil {
		t.Fatal(err)
	}
	a.stop()
	late.Data["v"] = "after the term"
	if err := w.Update(ctx, late); err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("a write through the stamping client after the term: %v; want it refused before sending", err)
	}
	if err := c.Update(ctx, held); lock.Refusal(err) == nil {
		t.Fatalf("a write stamped during the term and sent after it: %v; want a fencing refusal", err)
	}
	got := &corev1.ConfigMap{}
	if err := env.Admin.Get(ctx, client.ObjectKeyFromObject(late), got); err != nil || got.Data["v"] != "1" {
		t.Fatalf("the object after the refused writes: %v, %v", err, got.Data)
	}
}

// Check fails only when a term ended more than HealthzTimeout ago and its
// work has not stopped.
func TestHealthCheck(t *testing.T) {
	ns := namespace(t)
	fclk := clocktesting.NewFakeClock(time.Now())
	release := make(chan struct{})
	a := startCandidate(t, as(t, "stuck"), ns, "controllers/stuck", "a",
		election.Config{LeaseDuration: 30 * time.Second, HealthzTimeout: 10 * time.Second, Clock: fclk},
		func(context.Context, *election.Term) { <-release }) // ignores its leader context
	term := waitTerm(t, a, 0)
	if err := a.e.Check(nil); err != nil {
		t.Fatalf("a running leader: %v", err)
	}
	a.cancel()
	eventually(t, "the leader context is cancelled", func() bool { return closed(term.Context().Done()) })
	if err := a.e.Check(nil); err != nil {
		t.Fatalf("just after the term ended: %v", err)
	}
	fclk.Step(11 * time.Second)
	if err := a.e.Check(nil); err == nil {
		t.Fatal("work still running 11 s after its term ended: Check passed")
	}
	close(release)
	<-a.done
	if err := a.e.Check(nil); err != nil || a.stoppedCount() != 1 {
		t.Fatalf("after the work stopped: Check %v, OnStoppedLeading %d times", err, a.stoppedCount())
	}
}

// A term whose controllers cannot be built stops the manager with the
// error, instead of leading with nothing running.
func TestSetupErrorStopsTheManager(t *testing.T) {
	ns := namespace(t)
	rc := rest.CopyConfig(env.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:ops:broken", Groups: []string{"system:serviceaccounts"}}
	mgr, err := ctrl.NewManager(rc, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}})
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("the reconciler's dependencies are missing")
	var stopped int
	e, err := election.AddToManager(mgr, election.Config{Client: as(t, "broken"), Namespace: ns, Resource: "controllers/broken", Identity: "a",
		LeaseDuration: 30 * time.Second, Callbacks: election.Callbacks{OnStoppedLeading: func() { stopped++ }}},
		func(manager.Manager, *election.Term) error { return broken })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := mgr.Start(ctx); !errors.Is(err, broken) {
		t.Fatalf("mgr.Start = %v; want the setup error", err)
	}
	if e.IsLeader() || stopped != 1 {
		t.Fatalf("after the manager stopped: IsLeader %v, OnStoppedLeading %d times", e.IsLeader(), stopped)
	}
}
