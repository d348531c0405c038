package fencecounter_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
