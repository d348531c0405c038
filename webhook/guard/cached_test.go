package guard

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// store is a client.Reader over a fixed set of objects that counts its
// reads: the API server read directly, or an informer cache behind it.
type store struct {
	t     *testing.T
	objs  []client.Object
	gets  atomic.Int32
	never bool // fail the test on any read
}

func (s *store) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s.gets.Add(1)
	if s.never {
		s.t.Errorf("read %T %s from a reader that must not be read", obj, key)
	}
	for _, o := range s.objs {
		if reflect.TypeOf(o) == reflect.TypeOf(obj) && o.GetNamespace() == key.Namespace && o.GetName() == key.Name {
			reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(o.DeepCopyObject()).Elem())
			return nil
		}
	}
	return apierrors.NewNotFound(schema.GroupResource{Resource: reflect.TypeOf(obj).Elem().Name()}, key.Name)
}

func (s *store) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// recorder keeps the reasons of the Events it is asked to emit.
type recorder struct{ reasons []string }

func (r *recorder) Eventf(_, _ runtime.Object, _, reason, _, _ string, _ ...any) {
	r.reasons = append(r.reasons, reason)
}

const cachedResource = "orders"

var cacheNow = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// counter is the resource's FenceCounter at fence, naming holder (a
// grant of that fence, owned by owner) with lease end leaseEnd; no holder
// for "".
func counter(fence int64, holder, owner string, leaseEnd time.Time) *lockingv1alpha1.FenceCounter {
	c := &lockingv1alpha1.FenceCounter{
		ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: lockingv1alpha1.FenceCounterName(cachedResource)},
		Spec:       lockingv1alpha1.FenceCounterSpec{Resource: cachedResource, Fence: fence},
	}
	if holder != "" {
		c.Spec.Holder = &lockingv1alpha1.FenceHolder{Name: holder, UID: "uid-" + holder, Owner: owner, Fence: fence,
			ExpiresAt: leaseEnd.Format(time.RFC3339Nano)}
	}
	return c
}

// lockGrant is grant name of owner at fence in phase.
func lockGrant(name, owner string, fence int64, phase lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: name, UID: types.UID("uid-" + name)}}
	g.Spec.Resource, g.Spec.Owner = cachedResource, owner
	g.Status.Phase, g.Status.FenceToken = phase, fence
	return g
}

// object is the guarded ConfigMap with the record of grant rec at fence
// recFence (none for ""), and a claim of grant claimGrant at claimFence
// (none for "").
func guardedObject(t *testing.T, recGrant string, recFence int64, claimGrant, claimFence, intent string) runtime.RawExtension {
	ann := map[string]string{lockingv1alpha1.ResourceAnnotation: cachedResource}
	if recGrant != "" {
		ann[lockingv1alpha1.AcceptedGrantAnnotation] = "billing/" + recGrant
		ann[lockingv1alpha1.AcceptedFenceAnnotation] = fencing.FormatFence(recFence)
		if intent != "" {
			ann[lockingv1alpha1.AcceptedIntentAnnotation] = intent
		}
	}
	if claimGrant != "" {
		ann[lockingv1alpha1.GrantAnnotation] = claimGrant
		ann[lockingv1alpha1.FenceAnnotation] = claimFence
	}
	b, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "cm", "namespace": "billing", "resourceVersion": "41",
			"labels": map[string]string{lockingv1alpha1.GuardedLabel: "true"}, "annotations": ann},
	})
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: b}
}

// cachedWorld is a lagging cache and a current API server: the cache still
// names grant a (fence 1) with a live lease; the registry has moved on.
type cachedWorld struct {
	cache, direct *store
	events        *recorder
	handler       *LabelHandler
}

func newCachedWorld(t *testing.T, cached []client.Object, direct []client.Object, reads Reads) *cachedWorld {
	w := &cachedWorld{cache: &store{t: t, objs: cached}, direct: &store{t: t, objs: direct}, events: &recorder{}}
	issuer := &lockingv1alpha1.FenceIssuer{ObjectMeta: metav1.ObjectMeta{Name: lockingv1alpha1.DefaultFenceIssuerName}}
	w.direct.objs = append(w.direct.objs, issuer)
	w.handler = &LabelHandler{Checker: &Checker{
		Reader: w.direct, Cache: reads.CacheFor(w.cache), Clock: clocktesting.NewFakePassiveClock(cacheNow),
		Bundle:   func(context.Context) (*fencing.TrustBundle, error) { return nil, nil },
		Recorder: w.events,
	}}
	return w
}

// write sends an update by caller of the object stored as old into new;
// a delete when new is empty, with old's version as precondition.
func (w *cachedWorld) write(caller string, old, new runtime.RawExtension) admission.Response {
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, Name: "cm", Namespace: "billing", OldObject: old, Object: new,
		Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		UserInfo: authenticationv1.UserInfo{Username: caller},
	}}
	if new.Raw == nil {
		req.Operation = admissionv1.Delete
		opts, _ := json.Marshal(metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: ptrTo("41")}})
		req.Options = runtime.RawExtension{Raw: opts}
	}
	return w.handler.Handle(context.Background(), req)
}

func ptrTo[T any](v T) *T { return &v }

func refusedWith(t *testing.T, resp admission.Response, reason fencing.Reason) {
	t.Helper()
	if resp.Allowed {
		t.Fatalf("accepted, want %s", reason)
	}
	if resp.Result == nil || !strings.HasPrefix(resp.Result.Message, string(reason)) {
		t.Fatalf("refused %+v, want %s", resp.Result, reason)
	}
}

func accepted(t *testing.T, resp admission.Response) {
	t.Helper()
	if !resp.Allowed {
		t.Fatalf("refused: %+v", resp.Result)
	}
}

// The registry has handed the resource from a (fence 1) to b (fence 2);
// the answering replica's cache has not seen the swap yet.
var (
	aLease = cacheNow.Add(30 * time.Second)
	bLease = cacheNow.Add(60 * time.Second)
)

func handedOver() (cached, direct []client.Object) {
	return []client.Object{counter(1, "a", "A", aLease)},
		[]client.Object{counter(2, "b", "B", bLease), lockGrant("a", "A", 1, lockingv1alpha1.PhaseReleased), lockGrant("b", "B", 2, lockingv1alpha1.PhaseHeld)}
}

// A successor's first write is never refused because the cache still names
// the holder before it: it is decided on the direct read.
func TestCachedReadsAcceptTheSuccessorOnTheDirectRead(t *testing.T) {
	cached, direct := handedOver()
	w := newCachedWorld(t, cached, direct, ReadsCached)
	accepted(t, w.write("B", guardedObject(t, "a", 1, "", "", ""), guardedObject(t, "a", 1, "b", "2", "")))
	if w.direct.gets.Load() == 0 {
		t.Fatal("the successor's write was decided without a direct read")
	}
}

// The documented window: the old holder's write, while the answering
// replica's cache still names it with a live lease and the object records
// no higher fence, is accepted from the cache alone, ordered before the
// successor's first write.
func TestCachedReadsAcceptTheOldHolderInTheWatchLag(t *testing.T) {
	cached, direct := handedOver()
	w := newCachedWorld(t, cached, direct, ReadsCached)
	fromCache := counted(t, "cache")
	accepted(t, w.write("A", guardedObject(t, "a", 1, "", "", ""), guardedObject(t, "a", 1, "a", "1", "")))
	if n := w.direct.gets.Load(); n != 0 {
		t.Fatalf("an acceptance from the cache read the API server %d times", n)
	}
	if got := counted(t, "cache") - fromCache; got != 1 {
		t.Fatalf("lockwarden_guarded_write_registry_reads_total{read=cache} rose by %v, want 1", got)
	}
	// Its delete under its pre-delete write too.
	accepted(t, w.write("A", guardedObject(t, "a", 1, "", "", fencing.IntentDelete), runtime.RawExtension{}))
	if n := w.direct.gets.Load(); n != 0 {
		t.Fatalf("a delete accepted from the cache read the API server %d times", n)
	}
}

// Once the successor's write landed, the object's record refuses the old
// holder, however far behind the cache is: the check runs on the object
// the API server is about to replace.
func TestCachedReadsRefuseTheOldHolderBelowTheObjectsFence(t *testing.T) {
	cached, direct := handedOver()
	w := newCachedWorld(t, cached, direct, ReadsCached)
	refusedWith(t, w.write("A", guardedObject(t, "b", 2, "", "", ""), guardedObject(t, "b", 2, "a", "1", "")), fencing.ReasonStaleOwner)
	if w.direct.gets.Load() == 0 {
		t.Fatal("refused without a direct read")
	}
}

// The successor wrote its pre-delete write and deleted the object: its
// record went with it. The old holder's create of the object, on a replica
// whose cache still names it, has nothing on the object to order it
// against the successor's writes; accepted from the cache, it would land
// after the successor's delete, and the object would be the old holder's
// again. A write with no record to order it is decided on the direct read,
// which refuses it; the successor's own create is accepted there.
func TestCachedReadsRefuseTheOldHoldersCreateAfterTheSuccessorsDelete(t *testing.T) {
	cached, direct := handedOver()
	w := newCachedWorld(t, cached, direct, ReadsCached)
	created := guardedObject(t, "", 0, "a", "1", "")
	refusedWith(t, w.create("A", created), fencing.ReasonStaleOwner)
	if w.direct.gets.Load() == 0 {
		t.Fatal("the create was decided without a direct read")
	}
	accepted(t, w.create("B", guardedObject(t, "", 0, "b", "2", "")))
}

// create sends a create by caller of the object obj.
func (w *cachedWorld) create(caller string, obj runtime.RawExtension) admission.Response {
	return w.handler.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Name: "cm", Namespace: "billing", Object: obj,
		Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		UserInfo: authenticationv1.UserInfo{Username: caller},
	}})
}

// A lease end the cache recorded that has passed by the webhook's clock
// accepts nothing from the cache; the direct read refuses.
func TestCachedReadsRefuseAfterTheCachedLeaseEnd(t *testing.T) {
	over := cacheNow.Add(-time.Millisecond)
	w := newCachedWorld(t, []client.Object{counter(1, "a", "A", over)},
		[]client.Object{counter(1, "", "", time.Time{}), lockGrant("a", "A", 1, lockingv1alpha1.PhaseExpired)}, ReadsCached)
	refusedWith(t, w.write("A", guardedObject(t, "a", 1, "", "", ""), guardedObject(t, "a", 1, "a", "1", "")), fencing.ReasonExpired)
	if w.direct.gets.Load() == 0 {
		t.Fatal("refused without a direct read")
	}
}

// A refusal the cache alone shows is not the decision, and announces
// nothing: a FENCE_REGRESSION by a lagging cache's counter, where the
// registry has since issued fences above the object's record, is refused
// STALE_OWNER on the direct read, with no Event on the FenceIssuer.
func TestCachedReadsAnnounceOnlyTheDirectDecision(t *testing.T) {
	w := newCachedWorld(t, []client.Object{counter(1, "a", "A", aLease)},
		[]client.Object{counter(7, "b", "B", bLease), lockGrant("a", "A", 1, lockingv1alpha1.PhaseReleased)}, ReadsCached)
	refusedWith(t, w.write("A", guardedObject(t, "x", 5, "", "", ""), guardedObject(t, "x", 5, "a", "1", "")), fencing.ReasonStaleOwner)
	if len(w.events.reasons) != 0 {
		t.Fatalf("Events %v from a decision on the cache", w.events.reasons)
	}
	// The same regression on the direct read is announced.
	w.direct.objs[0] = counter(1, "a", "A", aLease)
	w.events.reasons = nil
	refusedWith(t, w.write("A", guardedObject(t, "x", 5, "", "", ""), guardedObject(t, "x", 5, "a", "1", "")), fencing.ReasonFenceRegression)
	if len(w.events.reasons) != 1 {
		t.Fatalf("Events %v, want the FENCE_REGRESSION", w.events.reasons)
	}
}

// --guard-reads=direct keeps the webhooks as they were: every decision
// reads the API server, and the cache is never consulted.
func TestDirectReadsNeverConsultTheCache(t *testing.T) {
	cached, direct := handedOver()
	w := newCachedWorld(t, cached, direct, ReadsDirect)
	w.cache.never = true
	refusedWith(t, w.write("A", guardedObject(t, "a", 1, "", "", ""), guardedObject(t, "a", 1, "a", "1", "")), fencing.ReasonStaleOwner)
	accepted(t, w.write("B", guardedObject(t, "a", 1, "", "", ""), guardedObject(t, "a", 1, "b", "2", "")))
	if w.direct.gets.Load() == 0 || w.cache.gets.Load() != 0 {
		t.Fatalf("direct reads %d, cache reads %d", w.direct.gets.Load(), w.cache.gets.Load())
	}
}

func TestParseReads(t *testing.T) {
	for _, s := range []string{"cached", "direct"} {
		if r, err := ParseReads(s); err != nil || string(r) != s {
			t.Errorf("ParseReads(%q) = %q, %v", s, r, err)
		}
	}
	if _, err := ParseReads("informer"); err == nil {
		t.Error("ParseReads accepted an unknown value")
	}
}

// counted is lockwarden_guarded_write_registry_reads_total{read}.
func counted(t *testing.T, read string) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := registryReads.WithLabelValues(read).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
