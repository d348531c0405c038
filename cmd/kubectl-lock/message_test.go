package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// A refusal prints its reason code first, whether the plugin made it or an
// admission policy or webhook of the API server answered it in its own
// words, and the rest of the error is not lost.
func TestRefusalsPrintTheirReasonFirst(t *testing.T) {
	gr := schema.GroupResource{Group: "locking.lockwarden.io", Resource: "lockgrants"}
	byPolicy := apierrors.NewForbidden(gr, "settlement-qcj9p", errors.New(
		"ValidatingAdmissionPolicy 'lockwarden-lockgrant-updates' with binding 'lockwarden-lockgrant-updates' denied request: ALREADY_ENDED: the grant has already ended"))
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"an admission policy's refusal", fmt.Errorf("lock: releasing grant billing/settlement-qcj9p: %w", denial.Wrap(byPolicy)), "ALREADY_ENDED: the grant has already ended\n"},
		{"the plugin's own refusal", fmt.Errorf("grant billing/nosuch: %w", &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: "no such grant"}), "grant billing/nosuch: UNKNOWN_GRANT: no such grant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := message(tc.err)
			if !strings.HasPrefix(got, tc.want) || !strings.Contains(got, tc.err.Error()) {
				t.Fatalf("printed %q, want it to start with %q and keep %q", got, tc.want, tc.err.Error())
			}
		})
	}
}
