package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// nsDeadWaiters is the namespace of the dead-waiter phase.
const nsDeadWaiters = "bench-deadwaiters"

// deadWaiterTTL is the lease of every grant of the phase, as the issue
// asks: a dead waiter that were granted would hold it that long.
const deadWaiterTTL = 30

// deadWaiters measures the handoff to a live waiter that has k waiters
// ahead of it whose client processes died while queued (k = 1 and 5): the
// time from the holder's release call to the live waiter observing itself
// holding. Each dead client renewed its session (5 s, pkg/lock's default)
// until it was killed, lead before the release; the live waiter renews its
// own session throughout. A dead waiter whose session had not yet lapsed at
// the release may still be granted, and is then ended when it lapses; the
// phase counts those, and checks that every fence still increases.
func (b *bench) deadWaiters(ctx context.Context) error {
	holder, err := newLWClient(ctx, b.cp, nsDeadWaiters, "holder", deadWaiterTTL)
	if err != nil {
		return err
	}
	defer holder.Close()
	live, err := newLWClient(ctx, b.cp, nsDeadWaiters, "live", deadWaiterTTL)
	if err != nil {
		return err
	}
	defer live.Close()
	liveSession, err := lock.NewSession(ctx, live.c, nsDeadWaiters, lock.DefaultSessionTTL)
	if err != nil {
		return fmt.Errorf("the live waiter's session: %w", err)
	}
	defer func() { _ = liveSession.Close(context.WithoutCancel(ctx)) }()
	user, err := whoAmI(ctx, live.c)
	if err != nil {
		return err
	}

	for _, lead := range []time.Duration{b.o.deadWaiterLead, 0} {
		for _, k := range []int{1, 5} {
			s := &series{system: sysLockwarden, metric: fmt.Sprintf("handoff, %d dead waiter(s) ahead, killed %s before the release (TTL %d s)", k, lead, deadWaiterTTL)}
			fmt.Printf("    %-32s %d rounds, %d dead waiter(s) ahead, killed %s before the release\n", sysLockwarden, b.o.deadWaiterRounds, k, lead)
			granted := 0
			for i := range b.o.deadWaiterRounds {
				d, g, err := b.deadWaiterRound(ctx, holder, live, liveSession, user, fmt.Sprintf("dead-%d-%s-%d", k, lead, i), k, lead)
				if err != nil {
					return fmt.Errorf("%d dead waiters, round %d: %w", k, i, err)
				}
				s.add(d)
				granted += g
			}
			b.res.latency(s, "deadwaiters")
			if lead == 0 && k == 1 {
				sum := summarize(s.ms)
				b.res.deadAtRelease = &sum
			}
			b.res.notes = append(b.res.notes, fmt.Sprintf("Dead waiters, k = %d, killed %s before the release: %d of %d dead requests were granted before their session lapsed (and ended when it did); the others were withdrawn without a fence.",
				k, lead, granted, k*b.o.deadWaiterRounds))
		}
	}
	return nil
}

// deadWaiterRound plays one handoff past k dead waiters and returns its
// latency.
func (b *bench) deadWaiterRound(ctx context.Context, holder, live *lwClient, liveSession *lock.Session, user, resource string, k int, lead time.Duration) (time.Duration, int, error) {
	cur, err := holder.Request(ctx, resource)
	if err != nil {
		return 0, 0, err
	}
	if err := cur.waitHeld(ctx, holdTimeout); err != nil {
		return 0, 0, err
	}
	var dead []*deadClient
	defer func() {
		for _, d := range dead {
			d.kill()
		}
	}()
	for j := range k {
		d, err := startDeadClient(ctx, live.c, nsDeadWaiters, user)
		if err != nil {
			return 0, 0, err
		}
		dead = append(dead, d)
		g := &lockingv1alpha1.LockGrant{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "dead-", Namespace: nsDeadWaiters},
			Spec: lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: deadWaiterTTL,
				Session: &lockingv1alpha1.SessionRef{Name: d.name, UID: string(d.uid)}},
		}
		if err := live.c.Create(ctx, g); err != nil {
			return 0, 0, fmt.Errorf("dead waiter %d: %w", j, err)
		}
		d.grant = client.ObjectKeyFromObject(g)
	}
	next, err := live.RequestUnder(ctx, resource, liveSession.Ref())
	if err != nil {
		return 0, 0, err
	}
	if err := next.waitQueued(ctx, queueTimeout); err != nil {
		return 0, 0, err
	}
	if err := sleep(ctx, settle); err != nil {
		return 0, 0, err
	}
	for _, d := range dead {
		d.kill()
	}
	if err := sleep(ctx, lead); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	if err := cur.release(ctx); err != nil {
		return 0, 0, err
	}
	if err := next.waitHeld(ctx, holdTimeout); err != nil {
		return 0, 0, err
	}
	took := next.heldAt.Sub(t0)
	granted := 0
	for _, d := range dead {
		g := &lockingv1alpha1.LockGrant{}
		if err := live.c.Get(ctx, d.grant, g); err != nil {
			return 0, 0, err
		}
		if g.Status.FenceToken != 0 {
			granted++
			if g.Status.FenceToken <= cur.fence || g.Status.FenceToken >= next.fence {
				return 0, 0, fmt.Errorf("a dead waiter's request %s got fence %d, not between %d and %d", d.grant.Name, g.Status.FenceToken, cur.fence, next.fence)
			}
		}
	}
	if next.fence != cur.fence+1+int64(granted) {
		return 0, 0, fmt.Errorf("the live waiter got fence %d after fence %d with %d dead waiters granted", next.fence, cur.fence, granted)
	}
	return took, granted, next.release(ctx)
}

// deadClient is the session of a client process that renews it until it is
// killed (kill stops the renewals and leaves the Lease behind, as SIGKILL
// would).
type deadClient struct {
	name  string
	uid   types.UID
	grant types.NamespacedName
	once  sync.Once
	stop  chan struct{}
}

func startDeadClient(ctx context.Context, c client.Client, ns, user string) (*deadClient, error) {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "dead-session-", Namespace: ns, Labels: map[string]string{lockingv1alpha1.SessionLabel: "true"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(user), LeaseDurationSeconds: ptr.To(int32(lock.DefaultSessionTTL / time.Second))},
	}
	if err := c.Create(ctx, l); err != nil {
		return nil, fmt.Errorf("creating a session: %w", err)
	}
	d := &deadClient{name: l.Name, uid: l.UID, stop: make(chan struct{})}
	go func() {
		t := time.NewTicker(lock.DefaultSessionTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-d.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				body, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": metav1.NewMicroTime(time.Now())}})
				_ = c.Patch(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: d.name}}, client.RawPatch(types.MergePatchType, body))
			}
		}
	}()
	return d, nil
}

func (d *deadClient) kill() { d.once.Do(func() { close(d.stop) }) }

// whoAmI returns the user name the client authenticates as.
func whoAmI(ctx context.Context, c client.Client) (string, error) {
	r := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, r); err != nil {
		return "", fmt.Errorf("SelfSubjectReview: %w", err)
	}
	return r.Status.UserInfo.Username, nil
}
