package lock_test

import (
	"context"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// faulty is a client whose requests the test can delay or whose replies it
// can lose, as a network would.
type faulty struct {
	client.WithWatch

	mu sync.Mutex
	// gate, when set, holds every renew until it is closed.
	gate chan struct{}
	// loseCreateReplies creates a LockGrant, then reports a timeout, this
	// many times (the creates of a session are not affected).
	loseCreateReplies int
	// loseRenewReplies renews, then reports a timeout, this many times.
	loseRenewReplies int
	// conflictRenews refuses this many renews with 409 Conflict, unapplied.
	conflictRenews int
	// renewsSent counts renew requests that reached the API server.
	renewsSent int
	// refuseRenews, refuseReleases: answer renews (releases) with this
	// error, unsent, as admission or RBAC would.
	refuseRenews, refuseReleases error
	// afterCreate runs after a LockGrant create landed, before its reply returns.
	afterCreate func()
}

var errLostReply = apierrors.NewTimeoutError("the reply was lost (test)", 0)

func (f *faulty) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := f.WithWatch.Create(ctx, obj, opts...)
	_, grant := obj.(*lockingv1alpha1.LockGrant)
	if err == nil && grant && f.afterCreate != nil {
		f.afterCreate()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && grant && f.loseCreateReplies > 0 {
		f.loseCreateReplies--
		return errLostReply
	}
	return err
}

func (f *faulty) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	data, _ := patch.Data(obj)
	f.mu.Lock()
	refuseRenews, refuseReleases := f.refuseRenews, f.refuseReleases
	f.mu.Unlock()
	if refuseReleases != nil && strings.Contains(string(data), `/spec/release"`) {
		return refuseReleases
	}
	if !strings.Contains(string(data), `/spec/renewals`) {
		return f.WithWatch.Patch(ctx, obj, patch, opts...)
	}
	if refuseRenews != nil {
		return refuseRenews
	}
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	if f.conflictRenews > 0 {
		f.conflictRenews--
		f.mu.Unlock()
		return apierrors.NewConflict(schema.GroupResource{Group: "locking.lockwarden.io", Resource: "lockgrants"}, obj.GetName(), errLostReply)
	}
	f.renewsSent++
	f.mu.Unlock()
	err := f.WithWatch.Patch(ctx, obj, patch, opts...)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && f.loseRenewReplies > 0 {
		f.loseRenewReplies--
		return errLostReply
	}
	return err
}

// hold makes renews wait until open is called.
func (f *faulty) hold() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
}

// open lets held renews through.
func (f *faulty) open() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gate != nil {
		close(f.gate)
		f.gate = nil
	}
}

func (f *faulty) sent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renewsSent
}
