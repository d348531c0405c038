package lock

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Stamp prepares obj for one guarded write under this lock: it labels it
// locking.lockwarden.io/guarded=true and sets the annotation
// locking.lockwarden.io/resource (the lock's fenced resource ID,
// Info.FencedResource: the resource ID itself for an exclusive lock, the
// slot's ID "ID#k" for slot k of a resource with permits) and the write's claim:
// locking.lockwarden.io/grant ("NAMESPACE/NAME" of the grant),
// locking.lockwarden.io/fence (the fence, in decimal) and
// locking.lockwarden.io/proof (the signed grant record, when the registry
// publishes one), and a fresh random locking.lockwarden.io/write-id. Send the
// write right after. The guarded-write admission
// webhook accepts it only while this grant is the resource's current,
// unexpired holder and no newer fence has been accepted by the object
// (Kleppmann's fencing token, 2016), and consumes the claim: it removes it
// from the object in the same write and records what it accepted in the
// locking.lockwarden.io/accepted-* annotations. So stamp every write anew,
// including each retry after a conflict: a write that does not carry its own
// claim is refused, even when sent by the holder's own identity.
//
// It returns Check's error, changing nothing, when the holder may not start
// an effect, and an error wrapping fencing.ErrBindingMismatch when obj is
// already guarded by another fenced resource ID (another resource, or
// another slot of this one: each slot's objects take only that slot's
// fences) or when the grant's signed record names another one than its
// status.
func (h *Handle) Stamp(obj metav1.Object) error {
	return h.stamp(obj, "")
}

// StampDelete stamps obj like Stamp for the write that prepares its delete
// (the claim's intent is "delete"). Send that write, then delete the object
// with the resourceVersion the write returned as a precondition; Delete does
// both.
func (h *Handle) StampDelete(obj metav1.Object) error {
	return h.stamp(obj, fencing.IntentDelete)
}

func (h *Handle) stamp(obj metav1.Object, intent string) error {
	if _, err := h.Check(); err != nil {
		return err
	}
	fenced, fence, proof, err := h.claim()
	if err != nil {
		return err
	}
	ann := obj.GetAnnotations()
	if r := ann[lockingv1alpha1.ResourceAnnotation]; r != "" && r != fenced {
		return fmt.Errorf("lock: %w", &fencing.Error{Reason: fencing.ReasonBindingMismatch,
			Detail: fmt.Sprintf("object %s/%s is guarded by resource %q, the lock holds %q", obj.GetNamespace(), obj.GetName(), r, fenced)})
	}
	if ann == nil {
		ann = map[string]string{}
	}
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[lockingv1alpha1.GuardedLabel] = "true"
	ann[lockingv1alpha1.ResourceAnnotation] = fenced
	ann[lockingv1alpha1.GrantAnnotation] = h.key.Namespace + "/" + h.key.Name
	ann[lockingv1alpha1.FenceAnnotation] = fencing.FormatFence(fence)
	if proof != "" {
		ann[lockingv1alpha1.ProofAnnotation] = proof
	} else {
		delete(ann, lockingv1alpha1.ProofAnnotation)
	}
	if intent != "" {
		ann[lockingv1alpha1.IntentAnnotation] = intent
	} else {
		delete(ann, lockingv1alpha1.IntentAnnotation)
	}
	// A fresh random write ID: nobody can put this claim on the object
	// before this write (a look-alike squatting the grant and fence).
	ann[lockingv1alpha1.WriteIDAnnotation] = newDriverToken()
	obj.SetLabels(labels)
	obj.SetAnnotations(ann)
	return nil
}

// Delete deletes a guarded object under this lock: it stamps obj with
// StampDelete, updates it (obj must be the object as last read: the update
// carries its resourceVersion), and deletes it with the resourceVersion the
// update made as precondition, so that no other write can slip in between.
// A refusal of either step is returned wrapping the API server's error.
func (h *Handle) Delete(ctx context.Context, c client.Client, obj client.Object) error {
	if err := h.StampDelete(obj); err != nil {
		return err
	}
	if err := c.Update(ctx, obj); err != nil {
		return fmt.Errorf("lock: preparing the delete of %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	rv := obj.GetResourceVersion()
	if err := c.Delete(ctx, obj, client.Preconditions{ResourceVersion: &rv}); err != nil {
		return fmt.Errorf("lock: deleting %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	return nil
}

// ReportFenceRegression records on the grant (annotation
// locking.lockwarden.io/fence-regression, with detail as its value) that a
// protected resource refused this grant's write with FENCE_REGRESSION: the
// registry issued a fence the resource had already seen, as after a restore
// from an old snapshot. The controller then raises the grant's
// FenceRegression condition, a Warning Event and a metric, so that an
// operator bumps the issuer epoch. It works on a spent handle too.
func (h *Handle) ReportFenceRegression(ctx context.Context, detail string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         h.uid,
		"annotations": map[string]string{lockingv1alpha1.FenceRegressionAnnotation: detail},
	}})
	if err != nil {
		return err
	}
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: h.key.Namespace, Name: h.key.Name}}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	if err := h.c.c.Patch(ctx, g, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("lock: reporting FENCE_REGRESSION on grant %s: %w", h.key, err)
	}
	return nil
}

// Segment is one step of a multi-segment operation under a lock, as a
// segment store (the PostgreSQL store of the segments design) checks it:
// the fence and the grant it was issued to, the operation root shared by
// every segment and retry of the operation, and the segment's sequence
// number. The store accepts a larger fence only at sequence 1 of the
// operation and an equal fence only at the next sequence of the same root.
// Fences increase per namespace and fenced resource ID (and per cluster),
// so a store keys its records by Grant.Namespace and Resource together (in
// pkg/store/postgres: Segment.Namespace and Segment.Resource).
type Segment struct {
	// Resource is the fenced resource ID of the lock (Info.FencedResource),
	// scoped to Grant.Namespace: the resource ID of an exclusive lock, or
	// the slot's ID "ID#k" for slot k of a resource with permits.
	Resource string
	// Grant is the LockGrant's namespace and name. Its namespace is the
	// namespace the resource ID and the fence belong to.
	Grant types.NamespacedName
	// GrantUID is the LockGrant's UID (the record's leaseID).
	GrantUID types.UID
	// Owner is the grant's owner: the identity the store checks the writer
	// against.
	Owner string
	// Fence is the grant's fencing token.
	Fence int64
	// OperationRoot is the operation's stable ID (WithOperationRoot).
	OperationRoot string
	// Seq is the segment's position in the operation, from 1.
	Seq int64
}

// Fencing returns the segment as the fencing rules check it
// (fencing.CheckSegment), for the segment's canonical payload bytes.
func (s Segment) Fencing(payload []byte) fencing.Segment {
	return fencing.Segment{
		Fence:    s.Fence,
		GrantUID: string(s.GrantUID),
		Root:     s.OperationRoot,
		Seq:      s.Seq,
		Digest:   fencing.PayloadDigest(payload),
	}
}

// NextSegment returns the next segment of this handle's operation: Seq 1
// on the first call, then 2, 3, ... (after ResumeSegmentsAfter(n): n+1,
// n+2, ...). It fails with Check's error while the holder may not start an
// effect, and then consumes no sequence number.
func (h *Handle) NextSegment() (Segment, error) {
	if _, err := h.Check(); err != nil {
		return Segment{}, err
	}
	fenced, fence, _, err := h.claim()
	if err != nil {
		return Segment{}, err
	}
	return Segment{
		Resource:      fenced,
		Grant:         h.key,
		GrantUID:      h.uid,
		Owner:         h.owner,
		Fence:         fence,
		OperationRoot: h.opRoot,
		Seq:           h.seq.Add(1),
	}, nil
}

// ResumeSegmentsAfter makes the next segment seq+1: for a holder that
// takes over an operation another grant started, once the store said how
// far it got (a retry of an operation an earlier holder left unfinished).
// It never moves the sequence back.
func (h *Handle) ResumeSegmentsAfter(seq int64) {
	for {
		cur := h.seq.Load()
		if seq <= cur || h.seq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// claim returns what a write of this handle carries: the fenced resource
// ID it is bound to, the fence and the proof ("" before the status
// arrived, or when the registry publishes none), after checking that the
// grant's signed record, when the registry publishes one, names the same
// fenced resource ID: a proof of another slot would be refused by every
// verifier, so the write is not sent.
func (h *Handle) claim() (fenced string, fence int64, proof string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fenced = h.fencedLocked()
	if h.last != nil && h.last.Status.Record != nil && h.last.Status.Record.Resource != fenced {
		return "", 0, "", fmt.Errorf("lock: %w", &fencing.Error{Reason: fencing.ReasonBindingMismatch,
			Detail: fmt.Sprintf("grant %s holds %q, but its signed record names %q", h.key, fenced, h.last.Status.Record.Resource)})
	}
	if h.last != nil {
		proof = h.last.Status.Proof
	}
	return fenced, h.m.Fence(), proof, nil
}
