package controllers_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/membership"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

const (
	systemNS = envtest.ManagerNamespace
	// takeoverDelay is longer than the manager's default, so that a
	// preferred replica slowed by a loaded machine is not taken over.
	takeoverDelay = 2 * time.Second
	// handoffs is how many acquire-release cycles each side plays.
	handoffs = 12
	// syncTimeout is how long a replica's controllers wait for their
	// caches before the replica stops.
	syncTimeout = 5 * time.Second
)

// Two manager replicas as the shipped Deployment runs them: leader election
// on, the LockGrant controller on every replica, each resource first handled
// by its preferred replica. Whichever replica leads, the one that is not
// preferred for a resource leaves it alone while the preferred one keeps up:
// it neither reads the resource's counter from the API server nor races the
// preferred replica's compare-and-swap. The counts come from each replica's
// own HTTP traffic.
func TestReplicasLeaveEachResourceToItsPreferredReplica(t *testing.T) {
	cfg, c := startControlPlane(t)
	a, b := startReplica(t, cfg, "replica-a"), startReplica(t, cfg, "replica-b")

	var leader, standby *replica
	select {
	case <-a.elected:
		leader, standby = a, b
	case <-b.elected:
		leader, standby = b, a
	case <-time.After(60 * time.Second):
		t.Fatal("no replica was elected leader within 60 s")
	}
	t.Logf("%s leads, %s stands by", leader.id, standby.id)
	waitBothLive(t, c)
	// Both keep running, past their controllers' cache sync timeout:
	// every controller's caches start on the replica that does not lead
	// too (a cache only the leader runs stops the other replica).
	defer func() {
		for _, r := range []*replica{leader, standby} {
			select {
			case <-r.stopped:
				t.Errorf("replica %s stopped while the test ran", r.id)
			case <-time.After(time.Until(r.started.Add(3 * syncTimeout))):
			}
		}
	}()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "replicas-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	// The first grant waits for the issuer's keys, which the leader makes.
	g := acquire(t, c, ns.Name, "warmup")
	waitPhase(t, c, g, lockingv1alpha1.PhaseHeld, 60*time.Second)

	for _, side := range []struct {
		name           string
		preferred, not *replica
	}{
		{"preferred by the leader", leader, standby},
		{"preferred by the replica that does not lead", standby, leader},
	} {
		t.Run(side.name, func(t *testing.T) {
			res := resourcePreferredBy(t, ns.Name, side.preferred.id, side.preferred.id)
			counter := lockingv1alpha1.FenceCounterName(res)
			before, beforePreferred := side.not.traffic.of(ns.Name, counter), side.preferred.traffic.of(ns.Name, counter)
			for range handoffs {
				g := acquire(t, c, ns.Name, res)
				g = waitPhase(t, c, g, lockingv1alpha1.PhaseHeld, 30*time.Second)
				// A merge patch, as kubectl and the client send it: the
				// grant's status may move meanwhile.
				base := g.DeepCopy()
				g.Spec.Release = true
				if err := c.Patch(t.Context(), g, client.MergeFrom(base)); err != nil {
					t.Fatal(err)
				}
				waitPhase(t, c, g, lockingv1alpha1.PhaseReleased, 30*time.Second)
			}
			other := side.not.traffic.of(ns.Name, counter).minus(before)
			preferred := side.preferred.traffic.of(ns.Name, counter).minus(beforePreferred)
			t.Logf("%d handoffs; %s (preferred): %s; %s: %s", handoffs, side.preferred.id, preferred, side.not.id, other)
			// A takeover (the deferral is capped at the delay plus a
			// replica Lease's duration while the state keeps moving) may
			// read the counter now and then; acting on every event reads
			// it at least once per handoff.
			if other.reads >= handoffs/2 {
				t.Errorf("%s, not preferred, read the counter %d times in %d handoffs: it did not leave the resource to %s", side.not.id, other.reads, handoffs, side.preferred.id)
			}
			if conflicts := other.conflicts + preferred.conflicts; conflicts >= handoffs/4 {
				t.Errorf("%d of the counter's compare-and-swaps conflicted in %d handoffs: both replicas acted on the resource", conflicts, handoffs)
			}
		})
	}
}

// replica is one manager run by the test, with the HTTP traffic it sent.
type replica struct {
	id      string
	started time.Time
	elected <-chan struct{}
	stopped <-chan struct{}
	traffic *traffic
}

// startReplica starts a manager as cmd/manager does with --leader-elect and
// --grants-on-every-replica, until the test ends.
func startReplica(t *testing.T, cfg *rest.Config, id string) *replica {
	t.Helper()
	tr := &traffic{counts: map[string]counts{}}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return &counting{next: rt, traffic: tr} }
	scheme := newScheme()
	lease, renew, retry := 4*time.Second, 3*time.Second, 500*time.Millisecond
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:        {Namespaces: map[string]cache.Config{systemNS: {}}},
			&corev1.ConfigMap{}:     {Namespaces: map[string]cache.Config{systemNS: {}}},
			&coordinationv1.Lease{}: {Label: labels.SelectorFromSet(labels.Set{lockingv1alpha1.SessionLabel: "true"})},
		}},
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		LeaderElection:                true,
		LeaderElectionID:              "lockwarden.locking.lockwarden.io",
		LeaderElectionNamespace:       systemNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease, RenewDeadline: &renew, RetryPeriod: &retry,
		// Two managers in one process register the same controllers. A
		// controller whose caches never start (a cache only the leader
		// runs) stops its replica after the sync timeout: short here, so
		// that the suite sees it.
		Controller: config.Controller{SkipNameValidation: ptr.To(true), CacheSyncTimeout: syncTimeout},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		Clock: clock.RealClock{}, Keyring: &issuer.Keyring{Reader: mgr.GetClient(), Namespace: systemNS},
		Namespace: systemNS, GrantsOnEveryReplica: true,
		Replica: controllers.ReplicaOptions{ID: id, TakeoverDelay: takeoverDelay, LeaseDuration: 2 * time.Second, LeaseRenew: 500 * time.Millisecond},
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager %s: %v", id, err)
		}
	}()
	return &replica{id: id, started: time.Now(), elected: mgr.Elected(), stopped: done, traffic: tr}
}

// counts is one replica's requests on one FenceCounter: direct reads,
// update attempts, and the updates the API server refused with Conflict.
type counts struct{ reads, writes, conflicts int }

func (c counts) minus(o counts) counts {
	return counts{c.reads - o.reads, c.writes - o.writes, c.conflicts - o.conflicts}
}

func (c counts) String() string {
	return fmt.Sprintf("%d counter reads, %d writes, %d conflicts", c.reads, c.writes, c.conflicts)
}

// traffic is a replica's requests on single FenceCounters, by namespace
// and name (lists and watches, the cache's, are not counted).
type traffic struct {
	mu     sync.Mutex
	counts map[string]counts
}

// counting counts the requests of one of the replica's transports.
type counting struct {
	next    http.RoundTripper
	traffic *traffic
}

func (ct *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := ct.traffic
	resp, err := ct.next.RoundTrip(req)
	const group = "/apis/locking.lockwarden.io/v1alpha1/namespaces/"
	path, ok := strings.CutPrefix(req.URL.Path, group)
	if !ok {
		return resp, err
	}
	parts := strings.Split(path, "/")
	if len(parts) != 3 || parts[1] != "fencecounters" {
		return resp, err
	}
	key := parts[0] + "/" + parts[2]
	tr.mu.Lock()
	defer tr.mu.Unlock()
	c := tr.counts[key]
	switch req.Method {
	case http.MethodGet:
		c.reads++
	case http.MethodPut:
		c.writes++
		if err == nil && resp.StatusCode == http.StatusConflict {
			c.conflicts++
		}
	}
	tr.counts[key] = c
	return resp, err
}

func (tr *traffic) of(ns, name string) counts {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.counts[ns+"/"+name]
}

// waitBothLive waits until both replicas' Leases are renewed, so that each
// counts the other among the live replicas.
func waitBothLive(t *testing.T, c client.Client) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var leases coordinationv1.LeaseList
		if err := c.List(ctx, &leases, client.InNamespace(systemNS), client.HasLabels{lockgrant.ReplicaLabel}); err != nil {
			return false, err
		}
		live := 0
		for _, l := range leases.Items {
			if l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < time.Second {
				live++
			}
		}
		return live == 2, nil
	})
	if err != nil {
		t.Fatalf("the two replicas' Leases are not both renewed: %v", err)
	}
}

// resourcePreferredBy returns a resource ID of ns whose preferred replica
// among replica-a and replica-b is id.
func resourcePreferredBy(t *testing.T, ns, id, prefix string) string {
	t.Helper()
	for i := range 1000 {
		res := fmt.Sprintf("%s/%d", prefix, i)
		if membership.Preferred(ns+"/"+lockingv1alpha1.FenceCounterName(res), []string{"replica-a", "replica-b"}) == id {
			return res
		}
	}
	t.Fatalf("no resource preferred by %s", id)
	return ""
}

func acquire(t *testing.T, c client.Client, ns, res string) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "grant-"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: res, LeaseDurationSeconds: 30, Owner: "worker"},
	}
	if err := c.Create(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	return g
}

func waitPhase(t *testing.T, c client.Client, g *lockingv1alpha1.LockGrant, phase lockingv1alpha1.LockGrantPhase, timeout time.Duration) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			return false, err
		}
		return cur.Status.Phase == phase, nil
	})
	if err != nil {
		t.Fatalf("grant %s of %s never %s (status %+v): %v", g.Name, g.Spec.Resource, phase, cur.Status, err)
	}
	return cur
}

// startControlPlane starts envtest with lockwarden's CRDs and the manager's
// namespace, no manager (the test runs the replicas), and returns its
// config and an admin client.
func startControlPlane(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	env := envtest.StartControlPlane(t)
	if err := env.Admin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS}}); err != nil {
		t.Fatal(err)
	}
	return env.Config, env.Admin
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(lockingv1alpha1.AddToScheme(s))
	return s
}
