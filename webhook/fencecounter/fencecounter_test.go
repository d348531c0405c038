package fencecounter_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
	"github.com/lockwarden/lockwarden/webhook/fencecounter"
	"github.com/lockwarden/lockwarden/webhook/fenceissuer"
)

func counter(name, resource string, fence int64) *lockingv1alpha1.FenceCounter {
	c := &lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Resource: resource, Fence: fence}}
	c.Name, c.Namespace = name, "ns"
	return c
}

// namespaces is a reader of namespaces by name; a missing one is NotFound.
type namespaces map[string]*corev1.Namespace

func (n namespaces) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	ns, ok := n[key.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, key.Name)
	}
	ns.DeepCopyInto(obj.(*corev1.Namespace))
	return nil
}

func (namespaces) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// TestFenceCounterDelete checks that a delete is judged on the counter's
// namespace as read, and that a failed read is an error, not a refusal.
func TestFenceCounterDelete(t *testing.T) {
	gone := metav1.Now()
	v := &fencecounter.Validator{Reader: namespaces{
		"ns":          {ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		"terminating": {ObjectMeta: metav1.ObjectMeta{Name: "terminating", DeletionTimestamp: &gone}},
	}}
	tests := []struct {
		namespace string
		code      fencing.Reason
		errs      bool
	}{
		{"ns", fencing.ReasonCounterProtected, true},
		{"terminating", "", false},
		{"missing", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.namespace, func(t *testing.T) {
			c := counter(lockingv1alpha1.FenceCounterName("orders"), "orders", 3)
			c.Namespace = tc.namespace
			_, err := v.ValidateDelete(context.Background(), c)
			if (err != nil) != tc.errs {
				t.Fatalf("error %v, want one: %v", err, tc.errs)
			}
			if got := denial.Reason(err); got != tc.code {
				t.Fatalf("%v: reason %q, want %q", err, got, tc.code)
			}
		})
	}
}

func TestFenceCounterRules(t *testing.T) {
	v := &fencecounter.Validator{}
	right := lockingv1alpha1.FenceCounterName("orders")
	tests := []struct {
		name string
		call func() error
		// field, when set, is the Invalid error's field; else code is the
		// refusal's reason; neither: allowed.
		field string
		code  fencing.Reason
	}{
		{"named after its resource", func() error {
			_, err := v.ValidateCreate(context.Background(), counter(right, "orders", 0))
			return err
		}, "", ""},
		{"named after another resource", func() error {
			_, err := v.ValidateCreate(context.Background(), counter("orders-x", "orders", 0))
			return err
		}, "metadata.name", ""},
		{"raised", func() error {
			_, err := v.ValidateUpdate(context.Background(), counter(right, "orders", 3), counter(right, "orders", 4))
			return err
		}, "", ""},
		{"lowered", func() error {
			_, err := v.ValidateUpdate(context.Background(), counter(right, "orders", 3), counter(right, "orders", 2))
			return err
		}, "", fencing.ReasonFenceRegression},
		{"the FenceIssuer deleted", func() error {
			iss := &lockingv1alpha1.FenceIssuer{}
			iss.Name = lockingv1alpha1.DefaultFenceIssuerName
			_, err := fenceissuer.Validator{}.ValidateDelete(context.Background(), iss)
			return err
		}, "", fencing.ReasonCounterProtected},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			switch {
			case tc.field != "":
				if !apierrors.IsInvalid(err) {
					t.Fatalf("%v: want Invalid", err)
				}
				c := err.(apierrors.APIStatus).Status().Details.Causes //nolint:errorlint // the validator returns the status itself
				if len(c) != 1 || c[0].Field != tc.field || !strings.Contains(c[0].Message, "INVALID_SPEC: ") {
					t.Fatalf("causes %+v, want %s with INVALID_SPEC", c, tc.field)
				}
			case tc.code != "":
				if got := denial.Reason(err); got != tc.code {
					t.Fatalf("%v: reason %q, want %s", err, got, tc.code)
				}
			case err != nil:
				t.Fatalf("refused: %v", err)
			}
		})
	}
}
