package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// testNamespaceDeletion deletes a namespace holding a Held grant with a
// waiter behind it, their FenceCounter and a guarded object, by the real
// namespace controller, and waits until it is gone.
func testNamespaceDeletion(t *testing.T) {
	ensureRelease(t)
	ns := namespace(t, "doomed")
	guardedConfigMap(t, ns, "ledger", "ledger/doomed")
	waiting, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_, _ = lock.NewClient(env.c, lock.WithNamespace(ns)).Acquire(waiting, "ledger/doomed", lock.WithTTL(time.Minute), lock.WithWait(5*time.Minute))
	}()
	eventually(t, "a waiter queues behind the holder", time.Minute, func(ctx context.Context) (bool, error) {
		var list lockingv1alpha1.LockGrantList
		if err := env.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		return len(list.Items) == 2 && (list.Items[0].Status.Phase == lockingv1alpha1.PhasePending || list.Items[1].Status.Phase == lockingv1alpha1.PhasePending), nil
	})

	start := time.Now()
	if err := env.c.Delete(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "namespace "+ns+" is gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		n := &corev1.Namespace{}
		err := env.c.Get(ctx, types.NamespacedName{Name: ns}, n)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("%w: conditions %v", err, n.Status.Conditions)
	})
	record(t, "namespace with live grants and guarded objects deleted", time.Since(start), 0)
}

// testGarbageCollector: a guarded ConfigMap owned by an unguarded one. The
// garbage collector deletes without a fence, so its delete of the guarded
// dependent is refused NO_FENCE, like anyone's: with background deletion
// the owner goes and the dependent stays, with foreground deletion the
// owner waits for it. The holder's fenced delete then lets both complete.
func testGarbageCollector(t *testing.T) {
	ensureRelease(t)
	ns := namespace(t, "gc")
	for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
		name := strings.ToLower(string(policy))
		owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-batch"}}
		if err := env.c.Create(t.Context(), owner); err != nil {
			t.Fatal(err)
		}
		h := guardedConfigMap(t, ns, name+"-result", "batch/"+name)
		dep := &corev1.ConfigMap{}
		if err := env.c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name + "-result"}, dep); err != nil {
			t.Fatal(err)
		}
		dep.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, BlockOwnerDeletion: ptr.To(true)}}
		if err := h.Stamp(dep); err != nil {
			t.Fatal(err)
		}
		if err := env.c.Update(t.Context(), dep); err != nil {
			t.Fatalf("adding the owner reference under the fence: %v", err)
		}
		if err := env.c.Delete(t.Context(), owner, client.PropagationPolicy(policy)); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the garbage collector's delete of "+dep.Name+" is refused NO_FENCE", 2*time.Minute, func(context.Context) (bool, error) {
			return gcRefused(ns, dep.Name)
		})
		if err := env.c.Get(t.Context(), client.ObjectKeyFromObject(dep), dep); err != nil {
			t.Fatalf("the guarded dependent after the garbage collector tried: %v", err)
		}
		err := env.c.Get(t.Context(), client.ObjectKeyFromObject(owner), owner)
		switch policy {
		case metav1.DeletePropagationBackground:
			if !apierrors.IsNotFound(err) {
				t.Errorf("background deletion: the owner: %v, want it gone", err)
			}
		case metav1.DeletePropagationForeground:
			if err != nil || owner.DeletionTimestamp == nil {
				t.Errorf("foreground deletion: the owner: %v, want it waiting for its guarded dependent", err)
			}
		}
		if err := h.Delete(t.Context(), env.c, dep); err != nil {
			t.Fatalf("the holder's fenced delete: %v", err)
		}
		eventually(t, "the owner and its dependent are gone", time.Minute, func(ctx context.Context) (bool, error) {
			a := env.c.Get(ctx, client.ObjectKeyFromObject(owner), &corev1.ConfigMap{})
			b := env.c.Get(ctx, client.ObjectKeyFromObject(dep), &corev1.ConfigMap{})
			return apierrors.IsNotFound(a) && apierrors.IsNotFound(b), errors.Join(a, b)
		})
	}
}

// gcRefused reports whether the controller manager's log shows the garbage
// collector's delete of ConfigMap ns/name refused NO_FENCE.
func gcRefused(ns, name string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(env.dir, "logs", "kube-controller-manager.log"))
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "NO_FENCE") && strings.Contains(line, name) && strings.Contains(line, ns) {
			return true, nil
		}
	}
	return false, errors.New("no refusal in the controller manager's log yet")
}
