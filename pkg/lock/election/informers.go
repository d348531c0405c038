package election

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// termCache is the manager's cache as one term's controllers see it: the
// same shared informers, but every event handler a term's watch adds is
// removed when the term ends, so that a replica that leads many times does
// not pile up the handlers of its past terms' controllers; and a field
// index is added once, however many terms ask for it.
type termCache struct {
	cache.Cache
	r    *Runnable
	mu   sync.Mutex
	regs []registration
}

type registration struct {
	inf cache.Informer
	reg toolscache.ResourceEventHandlerRegistration
}

// GetInformer returns the shared informer for obj, wrapped so that the
// event handlers added through it are removed when the term ends.
func (c *termCache) GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error) {
	inf, err := c.Cache.GetInformer(ctx, obj, opts...)
	if err != nil {
		return nil, err
	}
	return &termInformer{Informer: inf, c: c}, nil
}

// GetInformerForKind returns the shared informer for gvk, wrapped so that
// the event handlers added through it are removed when the term ends.
func (c *termCache) GetInformerForKind(ctx context.Context, gvk schema.GroupVersionKind, opts ...cache.InformerGetOption) (cache.Informer, error) {
	inf, err := c.Cache.GetInformerForKind(ctx, gvk, opts...)
	if err != nil {
		return nil, err
	}
	return &termInformer{Informer: inf, c: c}, nil
}

// IndexField adds a field index the first time a term asks for it; the
// informers keep it for the next terms.
func (c *termCache) IndexField(ctx context.Context, obj client.Object, field string, fn client.IndexerFunc) error {
	return c.r.indexField(ctx, c.Cache, obj, field, fn)
}

// removeHandlers removes every handler the term added.
func (c *termCache) removeHandlers() error {
	c.mu.Lock()
	regs := c.regs
	c.regs = nil
	c.mu.Unlock()
	var errs []error
	for _, r := range regs {
		errs = append(errs, r.inf.RemoveEventHandler(r.reg))
	}
	return errors.Join(errs...)
}

func (c *termCache) track(inf cache.Informer, reg toolscache.ResourceEventHandlerRegistration, err error) (toolscache.ResourceEventHandlerRegistration, error) {
	if err == nil {
		c.mu.Lock()
		c.regs = append(c.regs, registration{inf: inf, reg: reg})
		c.mu.Unlock()
	}
	return reg, err
}

// termInformer is a shared informer whose added event handlers are tracked
// by the term's cache, to be removed when the term ends.
type termInformer struct {
	cache.Informer
	c *termCache
}

// AddEventHandler adds h to the shared informer and records its
// registration for removal when the term ends.
func (i *termInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	reg, err := i.Informer.AddEventHandler(h)
	return i.c.track(i.Informer, reg, err)
}

// AddEventHandlerWithResyncPeriod adds h with resync period d to the
// shared informer and records its registration for removal when the term
// ends.
func (i *termInformer) AddEventHandlerWithResyncPeriod(h toolscache.ResourceEventHandler, d time.Duration) (toolscache.ResourceEventHandlerRegistration, error) {
	reg, err := i.Informer.AddEventHandlerWithResyncPeriod(h, d)
	return i.c.track(i.Informer, reg, err)
}

// AddEventHandlerWithOptions adds h with options o to the shared informer
// and records its registration for removal when the term ends.
func (i *termInformer) AddEventHandlerWithOptions(h toolscache.ResourceEventHandler, o toolscache.HandlerOptions) (toolscache.ResourceEventHandlerRegistration, error) {
	reg, err := i.Informer.AddEventHandlerWithOptions(h, o)
	return i.c.track(i.Informer, reg, err)
}
