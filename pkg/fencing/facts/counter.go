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

// ReadCounter reads the fence record of resource (a fenced resource ID) in
// ns with r, which must read from the API server as for ReadRegistry: the
// facts of a request that names no grant but is judged on the registry's
// fence (an administrator's override). nil when there is no record.
func ReadCounter(ctx context.Context, r client.Reader, ns, resource string) (*fencing.Counter, error) {
	counter := &lockingv1alpha1.FenceCounter{}
	key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(resource)}
	switch err := r.Get(ctx, key, counter); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading fence counter %s: %w", key, err)
	}
	return Counter(counter), nil
}
