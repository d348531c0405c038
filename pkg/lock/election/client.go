package election

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// StampingClient returns c wrapped so that its writes to guarded objects
// carry term's claim, and fail before they are sent once the term is over.
// An object is guarded when it is labeled locking.lockwarden.io/guarded=true
// or annotated locking.lockwarden.io/resource with the term's resource; all
// other writes, and every read, go to c unchanged.
//
//   - Create and Update stamp obj (Term.Stamp) and send it.
//   - Patch stamps obj and adds the claim to the patch itself: a merge or
//     strategic merge patch gets the claim's annotations and the guarded
//     label merged in, a JSON patch gets "add" operations for them, and an
//     apply patch is obj, stamped. (A merge patch computed by
//     client.MergeFrom would drop an annotation whose value equals the
//     original's; the claim is always sent.)
//   - Delete reads the object, and when it is guarded, writes the claim
//     with intent "delete" and deletes with that write's resourceVersion
//     and the object's UID as preconditions (lock.Handle.Delete); the
//     caller's other delete options are kept.
//   - Status() and SubResource() writers stamp Create, Update and Patch
//     the same way.
//
// Not stamped: Apply with an apply configuration, and DeleteAllOf; the
// guarded-write webhook refuses them on guarded objects (NO_FENCE), as it
// refuses any write to a guarded object whose in-memory copy lacks the
// label and the resource annotation. Every write is thus fenced or
// refused, never sent with a stale or missing claim by this client.
func StampingClient(c client.Client, term *Term) client.Client {
	return &stampingClient{Client: c, term: term}
}

type stampingClient struct {
	client.Client
	term *Term
}

var _ client.Client = &stampingClient{}

// guarded reports whether obj is a guarded object of the term's fenced
// resource ID (lock.Info.FencedResource).
func guarded(obj client.Object, resource string) bool {
	return obj.GetLabels()[lockingv1alpha1.GuardedLabel] == "true" || obj.GetAnnotations()[lockingv1alpha1.ResourceAnnotation] == resource
}

// stamp stamps obj when it is guarded.
func (s *stampingClient) stamp(obj client.Object) (bool, error) {
	if !guarded(obj, s.term.h.Info().FencedResource) {
		return false, nil
	}
	if err := s.term.Stamp(obj); err != nil {
		return false, fmt.Errorf("election: stamping the write of %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	return true, nil
}

// Create stamps obj with the term's claim when it is guarded, then creates it.
func (s *stampingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, err := s.stamp(obj); err != nil {
		return err
	}
	return s.Client.Create(ctx, obj, opts...)
}

// Update stamps obj with the term's claim when it is guarded, then updates it.
func (s *stampingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if _, err := s.stamp(obj); err != nil {
		return err
	}
	return s.Client.Update(ctx, obj, opts...)
}

// Patch stamps obj with the term's claim when it is guarded and adds the
// claim to the patch itself (claimPatch), then sends the patch.
func (s *stampingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	ok, err := s.stamp(obj)
	if err != nil {
		return err
	}
	if ok {
		patch = claimPatch{Patch: patch}
	}
	return s.Client.Patch(ctx, obj, patch, opts...)
}

// Delete reads the object; when it is guarded, it first writes the term's
// claim with intent "delete", then deletes with that write's resourceVersion
// and the object's UID as preconditions. Other objects are deleted as asked.
func (s *stampingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	cur, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("election: %T is not a client.Object", obj)
	}
	if err := s.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return err
	}
	if !guarded(cur, s.term.h.Info().FencedResource) {
		return s.Client.Delete(ctx, obj, opts...)
	}
	if err := s.term.Context().Err(); err != nil {
		return fmt.Errorf("election: stamping the delete of %s: %w", client.ObjectKeyFromObject(obj), context.Cause(s.term.Context()))
	}
	if err := s.term.h.StampDelete(cur); err != nil {
		return fmt.Errorf("election: stamping the delete of %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	if err := s.Client.Update(ctx, cur); err != nil {
		return fmt.Errorf("election: preparing the delete of %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	rv, uid := cur.GetResourceVersion(), cur.GetUID()
	return s.Client.Delete(ctx, cur, append(opts, client.Preconditions{UID: &uid, ResourceVersion: &rv})...)
}

// Status returns the status writer whose writes are stamped like this
// client's.
func (s *stampingClient) Status() client.SubResourceWriter {
	return &stampingSubResource{SubResourceWriter: s.Client.Status(), s: s}
}

// SubResource returns the subresource client whose writes are stamped like
// this client's; its reads are unchanged.
func (s *stampingClient) SubResource(subResource string) client.SubResourceClient {
	return &stampingSubResourceClient{SubResourceClient: s.Client.SubResource(subResource), s: s}
}

// stampingSubResourceClient is a subresource client whose writes carry the
// term's claim (stampingSubResource).
type stampingSubResourceClient struct {
	client.SubResourceClient
	s *stampingClient
}

// Create stamps obj like stampingSubResource.Create, then creates sub.
func (c *stampingSubResourceClient) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return (&stampingSubResource{SubResourceWriter: c.SubResourceClient, s: c.s}).Create(ctx, obj, sub, opts...)
}

// Update stamps obj like stampingSubResource.Update, then updates the
// subresource.
func (c *stampingSubResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return (&stampingSubResource{SubResourceWriter: c.SubResourceClient, s: c.s}).Update(ctx, obj, opts...)
}

// Patch stamps obj and its patch like stampingSubResource.Patch, then
// patches the subresource.
func (c *stampingSubResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return (&stampingSubResource{SubResourceWriter: c.SubResourceClient, s: c.s}).Patch(ctx, obj, patch, opts...)
}

// stampingSubResource is a subresource writer whose writes carry the term's
// claim.
type stampingSubResource struct {
	client.SubResourceWriter
	s *stampingClient
}

// Create stamps obj with the term's claim when it is guarded, then creates
// sub.
func (w *stampingSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if _, err := w.s.stamp(obj); err != nil {
		return err
	}
	return w.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

// Update stamps obj with the term's claim when it is guarded, then updates
// the subresource.
func (w *stampingSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if _, err := w.s.stamp(obj); err != nil {
		return err
	}
	return w.SubResourceWriter.Update(ctx, obj, opts...)
}

// Patch stamps obj with the term's claim when it is guarded and adds the
// claim to the patch itself (claimPatch), then patches the subresource.
func (w *stampingSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	ok, err := w.s.stamp(obj)
	if err != nil {
		return err
	}
	if ok {
		patch = claimPatch{Patch: patch}
	}
	return w.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// claimKeys are the annotations of a write's claim that a patch must carry.
var claimKeys = []string{
	lockingv1alpha1.ResourceAnnotation, lockingv1alpha1.GrantAnnotation, lockingv1alpha1.FenceAnnotation,
	lockingv1alpha1.ProofAnnotation, lockingv1alpha1.WriteIDAnnotation,
}

// claimPatch is a patch with the claim of the stamped object merged in.
type claimPatch struct {
	client.Patch
}

// Data returns the wrapped patch's data with obj's claim annotations and the
// guarded label added: merged into a merge or strategic merge patch, as
// "add" operations in a JSON patch. Other patches (apply) are returned
// as they are, since they serialize obj, which is stamped.
func (p claimPatch) Data(obj client.Object) ([]byte, error) {
	data, err := p.Patch.Data(obj)
	if err != nil {
		return nil, err
	}
	ann := map[string]string{}
	for _, k := range claimKeys {
		if v, ok := obj.GetAnnotations()[k]; ok {
			ann[k] = v
		}
	}
	switch p.Type() {
	case types.MergePatchType, types.StrategicMergePatchType:
		m := map[string]any{}
		if len(data) > 0 {
			if err := json.Unmarshal(data, &m); err != nil {
				return nil, fmt.Errorf("election: adding the claim to a %s: %w", p.Type(), err)
			}
		}
		meta, _ := m["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		a, _ := meta["annotations"].(map[string]any)
		if a == nil {
			a = map[string]any{}
		}
		for k, v := range ann {
			a[k] = v
		}
		l, _ := meta["labels"].(map[string]any)
		if l == nil {
			l = map[string]any{}
		}
		l[lockingv1alpha1.GuardedLabel] = "true"
		meta["annotations"], meta["labels"], m["metadata"] = a, l, meta
		return json.Marshal(m)
	case types.JSONPatchType:
		var ops []map[string]any
		if len(data) > 0 {
			if err := json.Unmarshal(data, &ops); err != nil {
				return nil, fmt.Errorf("election: adding the claim to a %s: %w", p.Type(), err)
			}
		}
		// A guarded object has annotations and labels already (its
		// resource, its guard label): "add" sets each key.
		for k, v := range ann {
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + escapePointer(k), "value": v})
		}
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/labels/" + escapePointer(lockingv1alpha1.GuardedLabel), "value": "true"})
		return json.Marshal(ops)
	}
	// Apply patches serialize obj, which is stamped.
	return data, nil
}

// escapePointer escapes a key for a JSON pointer (RFC 6901).
func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}
