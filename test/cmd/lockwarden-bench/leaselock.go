package main

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
)

// leaseClient is the minimal lock any API-server-mediated lock costs at
// least: a coordination.k8s.io Lease per resource, taken and given back by
// compare-and-swap on spec.holderIdentity (an Update carrying the
// resourceVersion it read), a waiter watching the Lease and swapping as
// soon as it sees it free or expired. No queue, no fence, no record.
type leaseClient struct {
	leases coordclient.LeaseInterface
	id     string
	// duration is spec.leaseDurationSeconds of its leases.
	duration int32
}

func newLeaseClient(cp *controlPlane, ns, id string, duration int32) (*leaseClient, error) {
	cs, err := kubernetes.NewForConfig(cp.clientConfig())
	if err != nil {
		return nil, err
	}
	return &leaseClient{leases: cs.CoordinationV1().Leases(ns), id: id, duration: duration}, nil
}

func (l *leaseClient) Close() {}

// leaseName is the Lease of a resource.
func leaseName(resource string) string { return "lock-" + resource }

// free reports whether nobody holds the Lease at now.
func free(le *coordinationv1.Lease, now time.Time) bool {
	s := le.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" {
		return true
	}
	return s.RenewTime != nil && s.LeaseDurationSeconds != nil &&
		!now.Before(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds)*time.Second))
}

// Request acquires the Lease of resource in the background.
func (l *leaseClient) Request(ctx context.Context, resource string) (*ticket, error) {
	t := newTicket()
	held := make(chan *coordinationv1.Lease, 1)
	go func() {
		le, err := l.acquire(ctx, leaseName(resource), t)
		if err != nil {
			t.fail(err)
			return
		}
		held <- le
		t.markHeld(time.Now(), 0)
	}()
	t.release = func(ctx context.Context) error {
		le := <-held
		le.Spec.HolderIdentity = nil
		if _, err := l.leases.Update(ctx, le, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("releasing Lease %s: %w", le.Name, err)
		}
		return nil
	}
	t.vanish = func(context.Context) (time.Time, error) {
		le := <-held
		return le.Spec.RenewTime.Add(time.Duration(*le.Spec.LeaseDurationSeconds) * time.Second), nil
	}
	return t, nil
}

// acquire takes the Lease by compare-and-swap, waiting on a watch while
// someone else holds it. It marks t queued once it waits.
func (l *leaseClient) acquire(ctx context.Context, name string, t *ticket) (*coordinationv1.Lease, error) {
	le, err := l.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		le = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if got, err := l.leases.Create(ctx, l.take(le), metav1.CreateOptions{}); err == nil {
			return got, nil
		} else if !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
		le, err = l.leases.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, err
	}
	for {
		if free(le, time.Now()) {
			got, err := l.leases.Update(ctx, l.take(le), metav1.UpdateOptions{})
			switch {
			case err == nil:
				return got, nil
			case !apierrors.IsConflict(err):
				return nil, err
			}
			// Someone else swapped first: read again.
			if le, err = l.leases.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return nil, err
			}
			continue
		}
		if le, err = l.waitFree(ctx, le, t); err != nil {
			return nil, err
		}
	}
}

// take returns a copy of le held by l from now.
func (l *leaseClient) take(le *coordinationv1.Lease) *coordinationv1.Lease {
	le = le.DeepCopy()
	now := metav1.NewMicroTime(time.Now())
	le.Spec.HolderIdentity = ptr.To(l.id)
	le.Spec.LeaseDurationSeconds = ptr.To(l.duration)
	le.Spec.AcquireTime, le.Spec.RenewTime = &now, &now
	return le
}

// waitFree watches le from its resourceVersion until it is free (released,
// or its lease expired by our clock), and returns the latest version seen.
func (l *leaseClient) waitFree(ctx context.Context, le *coordinationv1.Lease, t *ticket) (*coordinationv1.Lease, error) {
	w, err := l.leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", le.Name).String(),
		ResourceVersion: le.ResourceVersion,
	})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	t.markQueued()
	for {
		var expiry <-chan time.Time
		timer := time.NewTimer(time.Hour)
		if s := le.Spec; s.RenewTime != nil && s.LeaseDurationSeconds != nil {
			timer.Reset(time.Until(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second)))
			expiry = timer.C
		}
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-expiry:
			return le, nil
		case ev, ok = <-w.ResultChan():
			timer.Stop()
			if !ok {
				return le, nil // watch closed: read again
			}
			switch ev.Type {
			case watch.Modified, watch.Added:
				le = ev.Object.(*coordinationv1.Lease)
				if free(le, time.Now()) {
					return le, nil
				}
			case watch.Error:
				return l.leases.Get(ctx, le.Name, metav1.GetOptions{})
			}
		}
	}
}
