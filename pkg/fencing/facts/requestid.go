package facts

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// ReadSpentRequest reads what namespace ns's RequestIDLedger remembers of
// request ID id, for fencing.CheckRequestID: nil when the ledger does not
// exist or does not hold the ID. r must read from the API server, not a
// cache: the controller records an ID a moment before it deletes the
// grant, and a cache that had not seen the entry yet would let a retry in
// between the two.
func ReadSpentRequest(ctx context.Context, r client.Reader, ns, id string) (*fencing.SpentRequest, error) {
	l := &lockingv1alpha1.RequestIDLedger{}
	switch err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.RequestIDLedgerName}, l); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the request-ID ledger of namespace %s: %w", ns, err)
	}
	for i := range l.Spec.Entries {
		if e := &l.Spec.Entries[i]; e.RequestID == id {
			return SpentRequest(e), nil
		}
	}
	return nil, nil
}

// SpentRequest returns the fencing facts of one ledger entry; nil for nil.
func SpentRequest(e *lockingv1alpha1.SpentRequestID) *fencing.SpentRequest {
	if e == nil {
		return nil
	}
	return &fencing.SpentRequest{RequestID: e.RequestID, State: State(e.Phase), EndedAt: e.EndedAt.Time, SpentUntil: e.SpentUntil.Time}
}
