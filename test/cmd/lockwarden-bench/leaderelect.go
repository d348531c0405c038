package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// leTiming is a leader election configuration: lease duration, renew
// deadline, retry period.
type leTiming struct {
	lease, renew, retry time.Duration
}

func (t leTiming) String() string {
	return fmt.Sprintf("%s/%s/%s", fmtDur(t.lease), fmtDur(t.renew), fmtDur(t.retry))
}

func fmtDur(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d/time.Millisecond)
}

var (
	leFast    = leTiming{time.Second, 800 * time.Millisecond, 100 * time.Millisecond}
	leDefault = leTiming{15 * time.Second, 10 * time.Second, 2 * time.Second}
)

// leClient is a candidate of client-go tools/leaderelection on a Lease
// lock: acquiring is running an elector until it leads; releasing is
// cancelling it (with ReleaseOnCancel, the elector clears the holder).
type leClient struct {
	cs              kubernetes.Interface
	ns, id          string
	timing          leTiming
	releaseOnCancel bool
}

func newLEClient(cp *controlPlane, ns, id string, timing leTiming, releaseOnCancel bool) (*leClient, error) {
	cs, err := kubernetes.NewForConfig(cp.clientConfig())
	if err != nil {
		return nil, err
	}
	return &leClient{cs: cs, ns: ns, id: id, timing: timing, releaseOnCancel: releaseOnCancel}, nil
}

func (l *leClient) Close() {}

// Request runs an elector for the Lease of resource until released.
func (l *leClient) Request(ctx context.Context, resource string) (*ticket, error) {
	t := newTicket()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.ns, Name: leaseName(resource)},
		Client:     l.cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   l.timing.lease,
		RenewDeadline:   l.timing.renew,
		RetryPeriod:     l.timing.retry,
		ReleaseOnCancel: l.releaseOnCancel,
		Name:            resource,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { t.markHeld(time.Now(), 0) },
			OnStoppedLeading: func() {},
			// The first leader it reports is the one it found: it waits.
			OnNewLeader: func(identity string) {
				if identity != l.id {
					t.markQueued()
				}
			},
		},
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		le.Run(runCtx)
		t.fail(fmt.Errorf("elector of %s stopped before leading", l.id))
	}()
	t.release = func(context.Context) error {
		cancel()
		<-exited
		return nil
	}
	t.vanish = func(ctx context.Context) (time.Time, error) {
		if l.releaseOnCancel {
			return time.Time{}, fmt.Errorf("a candidate with ReleaseOnCancel cannot vanish")
		}
		cancel()
		<-exited
		lease, err := l.cs.CoordinationV1().Leases(l.ns).Get(ctx, leaseName(resource), metav1.GetOptions{})
		if err != nil {
			return time.Time{}, err
		}
		s := lease.Spec
		if s.HolderIdentity == nil || *s.HolderIdentity != l.id || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
			return time.Time{}, fmt.Errorf("lease %s is no longer %s's record", lease.Name, l.id)
		}
		return s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second), nil
	}
	return t, nil
}
