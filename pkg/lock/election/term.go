package election

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/pkg/lock"
)

// Term is one term of leadership: one held LockGrant and its fencing token.
// A Term is spent once its Context is cancelled: Stamp and the writes of
// Client fail from then on.
type Term struct {
	h        *lock.Handle
	ctx      context.Context
	identity string
}

// Fence returns the term's fencing token: strictly larger than every
// earlier term's of the same resource.
func (t *Term) Fence() int64 { return t.h.Info().Fence }

// Grant returns the namespace and name of the term's LockGrant.
func (t *Term) Grant() types.NamespacedName { return t.h.Info().Grant }

// Resource returns the election's resource ID.
func (t *Term) Resource() string { return t.h.Info().Resource }

// Identity returns the candidate's identity.
func (t *Term) Identity() string { return t.identity }

// Context returns the leader context: cancelled when the term ends (the
// handle's Context ended, or Run's context ended), with the reason as its
// cause (lock.ErrOwnershipUnknown, lock.ErrLost, ...).
func (t *Term) Context() context.Context { return t.ctx }

// Handle returns the term's lock handle, e.g. for segments
// (Handle.NextSegment) or its signed proof.
func (t *Term) Handle() *lock.Handle { return t.h }

// Stamp puts the term's claim on obj for one guarded write (lock.Handle.Stamp):
// the guarded label, the resource, the grant, the fence, the proof and a
// fresh write ID. It fails, changing nothing, once the term is over.
func (t *Term) Stamp(obj metav1.Object) error {
	if err := t.ctx.Err(); err != nil {
		return context.Cause(t.ctx)
	}
	return t.h.Stamp(obj)
}

// Client returns c wrapped so that every write to a guarded object carries
// this term's claim (see StampingClient).
func (t *Term) Client(c client.Client) client.Client { return StampingClient(c, t) }
