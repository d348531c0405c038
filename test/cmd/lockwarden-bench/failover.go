package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/pkg/lock/election"
)

// nsFailover is the namespace of the failover phase.
const nsFailover = "bench-failover"

// failoverLease is the lease of both elections in the failover phase: the
// fenced elector's term TTL, and client-go's LeaseDuration (leFast:
// 1s/800ms/100ms).
const failoverLease = time.Second

func sysFenced() string { return "fenced election " + fmtDur(failoverLease) }

// errKilled is every request of a killed candidate.
var errKilled = errors.New("bench: the candidate's process was killed")

// killSwitch cuts a candidate off the API server, as if its process had
// died: every request it sends from then on fails at once (its open watch
// streams may still deliver, which a dead process would not read).
type killSwitch struct{ dead atomic.Bool }

func (k *killSwitch) wrap(rc *rest.Config) *rest.Config {
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return killableRT{rt: rt, k: k} })
	return rc
}

type killableRT struct {
	rt http.RoundTripper
	k  *killSwitch
}

func (t killableRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.k.dead.Load() {
		return nil, errKilled
	}
	return t.rt.RoundTrip(r)
}

// candidate is one running elector of either kind.
type candidate struct {
	kill    killSwitch
	cancel  context.CancelFunc
	done    chan struct{}
	leading chan time.Time // when it started leading (buffered, first term)
	leader  chan string    // every leader it reported
}

func newCandidate() *candidate {
	return &candidate{done: make(chan struct{}), leading: make(chan time.Time, 1), leader: make(chan string, 16)}
}

func (c *candidate) started() {
	select {
	case c.leading <- time.Now():
	default:
	}
}

func (c *candidate) newLeader(id string) {
	select {
	case c.leader <- id:
	default:
	}
}

func (c *candidate) stop() {
	c.cancel()
	<-c.done
}

// startFenced runs a fenced elector (pkg/lock/election) for resource.
func (b *bench) startFenced(ctx context.Context, resource, id string) (*candidate, error) {
	c := newCandidate()
	cl, err := client.NewWithWatch(c.kill.wrap(b.cp.clientConfig()), client.Options{Scheme: newScheme()})
	if err != nil {
		return nil, err
	}
	e, err := election.New(election.Config{
		Client: cl, Namespace: nsFailover, Resource: resource, Identity: id, LeaseDuration: failoverLease,
		Callbacks: election.Callbacks{
			OnStartedLeading: func(ctx context.Context, _ *election.Term) { c.started(); <-ctx.Done() },
			OnNewLeader:      c.newLeader,
		},
	})
	if err != nil {
		return nil, err
	}
	ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		defer close(c.done)
		_ = e.Run(ctx)
	}()
	return c, nil
}

// startClientGo runs client-go's leader election on a Lease for resource,
// at leFast.
func (b *bench) startClientGo(ctx context.Context, resource, id string) (*candidate, error) {
	c := newCandidate()
	cs, err := kubernetes.NewForConfig(c.kill.wrap(b.cp.clientConfig()))
	if err != nil {
		return nil, err
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: nsFailover, Name: leaseName(resource)},
			Client:     cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration: leFast.lease, RenewDeadline: leFast.renew, RetryPeriod: leFast.retry,
		ReleaseOnCancel: true,
		Name:            resource,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { c.started() },
			OnStoppedLeading: func() {},
			OnNewLeader:      c.newLeader,
		},
	})
	if err != nil {
		return nil, err
	}
	ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		defer close(c.done)
		le.Run(ctx)
	}()
	return c, nil
}

// failover measures leader failover for the fenced elector and for
// client-go's leader election at the same lease (1 s): a leader is
// killed (every request of its process fails from then on), and the time
// until the follower's OnStartedLeading is recorded. Each round starts two
// fresh candidates on a fresh resource, waits until the follower reports
// the leader, then kills the leader.
func (b *bench) failover(ctx context.Context) error {
	metric := fmt.Sprintf("failover: leader killed → follower leads (lease %s)", fmtDur(failoverLease))
	kinds := []struct {
		key, system string
		start       func(context.Context, string, string) (*candidate, error)
	}{
		{"fenced", sysFenced(), b.startFenced},
		{"client-go", sysLE(leFast), b.startClientGo},
	}
	for _, k := range kinds {
		s := &series{system: k.system, metric: metric}
		fmt.Printf("    %-32s %d rounds\n", k.system, b.o.expiryRounds)
		for i := range b.o.expiryRounds {
			d, err := failoverRound(ctx, k.start, fmt.Sprintf("failover-%s-%d", k.key, i))
			if err != nil {
				return fmt.Errorf("%s: %w", k.system, err)
			}
			s.add(d)
		}
		b.res.latency(s, "failover")
	}
	return nil
}

// failoverRound runs one failover on resource and returns its duration.
func failoverRound(ctx context.Context, start func(context.Context, string, string) (*candidate, error), resource string) (time.Duration, error) {
	var stops []func()
	defer func() {
		var wg sync.WaitGroup
		for _, s := range stops {
			wg.Go(s)
		}
		wg.Wait()
	}()
	leader, err := start(ctx, resource, "leader")
	if err != nil {
		return 0, err
	}
	stops = append(stops, leader.stop)
	if _, err := waitFor(ctx, leader.leading, "the first candidate to lead"); err != nil {
		return 0, err
	}
	follower, err := start(ctx, resource, "follower")
	if err != nil {
		return 0, err
	}
	stops = append(stops, follower.stop)
	for {
		id, err := waitFor(ctx, follower.leader, "the follower to report the leader")
		if err != nil {
			return 0, err
		}
		if id == "leader" {
			break
		}
	}
	select {
	case <-follower.leading:
		return 0, errors.New("the follower led before the leader was killed: the leader lost a 1 s term on its own")
	default:
	}
	killed := time.Now()
	leader.kill.dead.Store(true)
	at, err := waitFor(ctx, follower.leading, "the follower to lead")
	if err != nil {
		return 0, err
	}
	return at.Sub(killed), nil
}

// waitFor receives from ch within a minute.
func waitFor[T any](ctx context.Context, ch <-chan T, what string) (T, error) {
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case v := <-ch:
		return v, nil
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	case <-t.C:
		var zero T
		return zero, fmt.Errorf("timed out waiting for %s", what)
	}
}
