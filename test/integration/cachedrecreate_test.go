package integration

import (
	"context"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/webhook/guard"
)

// The successor deletes a guarded object (its pre-delete write, then the
// delete), and its record goes with the object. The old holder then
// creates the object again under its released grant. A replica whose
// FenceCounter cache still names the old holder (its watch stalled before
// the handoff: a frozen replica, a broken connection) must not accept that
// create from its cache: nothing on the object orders it before the
// successor's writes, and it would land after the successor's delete. It
// is decided on the direct read, which refuses it, as the suite's own
// replica does.
func TestCachedReadsRefuseTheOldHoldersCreateAfterTheSuccessorsDelete(t *testing.T) {
	ns := namespace(t)
	a, b := as(t, "recreate-a"), as(t, "recreate-b")
	const obj = "recreated"
	ga := mustAcquire(t, a, ns, 60)
	if err := write(t, a, ns, obj, ga, fenceOf(ga), "a-1"); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	stale := pausedCounters(t, ns) // the counter naming a, as a stalled watch keeps it

	if err := release(t, a, ga); err != nil {
		t.Fatal(err)
	}
	gb := mustAcquire(t, b, ns, 60)
	if err := deleteAt(t, b, ns, obj, preDelete(t, b, ns, obj, gb)); err != nil {
		t.Fatalf("the successor's delete: %v", err)
	}

	behind := &guard.LabelHandler{Checker: &guard.Checker{
		Reader: admin, Cache: stale, Clock: clk, Recorder: noEvents{},
		Bundle: func(context.Context) (*fencing.TrustBundle, error) { return nil, nil },
	}}
	cm := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: obj,
			Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"},
			Annotations: map[string]string{
				lockingv1alpha1.ResourceAnnotation: resource,
				lockingv1alpha1.GrantAnnotation:    ga.Name,
				lockingv1alpha1.FenceAnnotation:    fenceOf(ga),
			}},
		Data: map[string]string{"result": "a-late"},
	}
	raw, err := json.Marshal(cm)
	if err != nil {
		t.Fatal(err)
	}
	resp := behind.Handle(t.Context(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "recreate", Operation: admissionv1.Create, Namespace: ns, Name: obj,
		Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Object:   runtime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: a.name},
	}})
	if resp.Allowed {
		t.Fatal("a replica whose cache still names the old holder accepted its create of the object its successor deleted")
	}
	wantReason(t, "the old holder's create after the successor's delete", write(t, a, ns, obj, ga, fenceOf(ga), "a-late"), "STALE_OWNER")
}

// pausedCounters returns a reader that shows ns's FenceCounters as they are
// now, and ever after, as a replica's informer does while its watch
// delivers nothing; every other read goes to the API server.
func pausedCounters(t *testing.T, ns string) client.Reader {
	t.Helper()
	var list lockingv1alpha1.FenceCounterList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	snapshot := list.DeepCopy()
	return interceptor.NewClient(env.Admin, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if fc, ok := o.(*lockingv1alpha1.FenceCounter); ok {
				for i := range snapshot.Items {
					if snapshot.Items[i].Namespace == key.Namespace && snapshot.Items[i].Name == key.Name {
						snapshot.Items[i].DeepCopyInto(fc)
						return nil
					}
				}
			}
			return c.Get(ctx, key, o, opts...)
		},
	})
}

// noEvents emits nothing.
type noEvents struct{}

func (noEvents) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
