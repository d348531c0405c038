package election

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// watchLeader follows the resource's FenceCounter until ctx ends and calls
// OnNewLeader when its holder becomes a term of another identity than the
// last reported. The identity is read from the holder's grant
// (IdentityAnnotation), or is the grant's owner for a grant made without
// an elector.
func (e *Elector) watchLeader(ctx context.Context) {
	name := lockingv1alpha1.FenceCounterName(e.cfg.Resource)
	opts := func(raw metav1.ListOptions) *client.ListOptions {
		return &client.ListOptions{Namespace: e.cfg.Namespace, FieldSelector: fields.OneTermEqualSelector("metadata.name", name), Raw: &raw}
	}
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l := &lockingv1alpha1.FenceCounterList{}
			return l, e.cfg.Client.List(ctx, l, opts(o))
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return e.cfg.Client.Watch(ctx, &lockingv1alpha1.FenceCounterList{}, opts(o))
		},
		DisableChunking: true,
	}
	var holder, reported string
	// The condition never holds: UntilWithSync relists and rewatches as
	// needed until ctx ends.
	_, _ = watchtools.UntilWithSync(ctx, lw, &lockingv1alpha1.FenceCounter{}, nil, func(ev watch.Event) (bool, error) {
		fc, ok := ev.Object.(*lockingv1alpha1.FenceCounter)
		if !ok || ev.Type == watch.Deleted || fc.Spec.Holder == nil || fc.Spec.Holder.Name == holder {
			return false, nil
		}
		holder = fc.Spec.Holder.Name
		identity := fc.Spec.Holder.Owner
		g := &lockingv1alpha1.LockGrant{}
		if err := e.cfg.Client.Get(ctx, types.NamespacedName{Namespace: e.cfg.Namespace, Name: holder}, g); err == nil &&
			string(g.UID) == fc.Spec.Holder.UID && g.Annotations[IdentityAnnotation] != "" {
			identity = g.Annotations[IdentityAnnotation]
		}
		if identity != reported {
			reported = identity
			e.cfg.Callbacks.OnNewLeader(identity)
		}
		return false, nil
	})
}
