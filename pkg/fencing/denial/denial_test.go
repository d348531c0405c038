package denial_test

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

var grants = schema.GroupResource{Group: "locking.lockwarden.io", Resource: "lockgrants"}

// allReasons lists every code package fencing defines.
var allReasons = []fencing.Reason{
	fencing.ReasonNoFence, fencing.ReasonNoResource, fencing.ReasonUnknownGrant, fencing.ReasonBindingMismatch,
	fencing.ReasonNotOwner, fencing.ReasonStaleOwner, fencing.ReasonExpired, fencing.ReasonNotHeld,
	fencing.ReasonAlreadyEnded, fencing.ReasonFenceRegression, fencing.ReasonRevoked, fencing.ReasonBadSignature,
	fencing.ReasonRevokedEpoch, fencing.ReasonInvalidSegment, fencing.ReasonSequenceGap, fencing.ReasonSegmentConflict,
	fencing.ReasonMutationUnknown, fencing.ReasonDriverMismatch, fencing.ReasonFenceNotIssued,
	fencing.ReasonSequenceExhausted, fencing.ReasonEpochBehind, fencing.ReasonOverrideRefused, fencing.ReasonRequestIDLive,
}

// What the webhooks encode, the decoder reads back: for every reason, from
// a typed validator's error, from an admission response as the API server
// returns it (message rewritten), and from the message alone when a proxy
// dropped the causes. The error then matches the reason's sentinel.
func TestRoundTrip(t *testing.T) {
	for _, r := range allReasons {
		ref := &fencing.Error{Reason: r, Detail: "fence 1 is older than fence 2: see the grant"}
		typed := deny.Error(ref, grants, "g1")
		resp := deny.Response(ref, grants, "g1")
		viaServer := &apierrors.StatusError{ErrStatus: *resp.Result}
		viaServer.ErrStatus.Message = fmt.Sprintf("admission webhook %q denied the request: %s", "guard.locking.lockwarden.io", resp.Result.Message)
		noCauses := &apierrors.StatusError{ErrStatus: *viaServer.ErrStatus.DeepCopy()}
		noCauses.ErrStatus.Details = nil
		for name, err := range map[string]error{"typed": typed, "server": viaServer, "no causes": noCauses, "wrapped": fmt.Errorf("lock: renewing: %w", noCauses)} {
			t.Run(string(r)+"/"+name, func(t *testing.T) {
				got := denial.Refusal(err)
				if got == nil || got.Reason != r || got.Detail != ref.Detail {
					t.Fatalf("Refusal(%v) = %#v, want %s with detail %q", err, got, r, ref.Detail)
				}
				w := denial.Wrap(err)
				if !errors.Is(w, r.Sentinel()) || fencing.ReasonOf(w) != r || !apierrors.IsForbidden(w) || w.Error() != err.Error() {
					t.Fatalf("Wrap(%v): errors.Is %s %v, ReasonOf %q, forbidden %v", err, r, errors.Is(w, r.Sentinel()), fencing.ReasonOf(w), apierrors.IsForbidden(w))
				}
			})
		}
	}
}

// What an admission policy answers (config/policy: a message that starts
// with the reason code, no typed cause), as the API server shapes it, the
// decoder reads back too. The live policy's own messages are read back the
// same way by test/admissionpolicy.
func TestRoundTripAdmissionPolicy(t *testing.T) {
	for _, r := range allReasons {
		detail := "\"bob\" cannot release a grant owned by \"alice\""
		msg := fmt.Sprintf("ValidatingAdmissionPolicy '%s' with binding '%s' denied request: %s: %s", "lockwarden-lockgrant-updates", "lockwarden-lockgrant-updates", r, detail)
		// As k8s.io/apiserver's policy dispatcher builds it: a Forbidden
		// with the policy's reason and the message as an untyped cause.
		err := apierrors.NewForbidden(grants, "g1", errors.New(msg))
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Message: msg})
		t.Run(string(r), func(t *testing.T) {
			got := denial.Refusal(err)
			if got == nil || got.Reason != r || got.Detail != detail {
				t.Fatalf("Refusal(%v) = %#v, want %s with detail %q", err, got, r, detail)
			}
			if w := denial.Wrap(err); !errors.Is(w, r.Sentinel()) || !apierrors.IsForbidden(w) {
				t.Fatalf("Wrap(%v) does not match %s", err, r)
			}
		})
	}
}

// Errors that are not lockwarden refusals decode to nothing, even when
// their text looks like one.
func TestNotRefusals(t *testing.T) {
	for name, err := range map[string]error{
		"nil":           nil,
		"plain":         errors.New("EXPIRED: not an API error"),
		"not forbidden": apierrors.NewBadRequest("INVALID_SPEC: no"),
		"conflict":      apierrors.NewConflict(grants, "g1", errors.New("EXPIRED: the object has been modified")),
		"unknown code":  apierrors.NewForbidden(grants, "g1", errors.New("SOMETHING_ELSE: rbac")),
		"rbac":          apierrors.NewForbidden(grants, "g1", errors.New(`User "bob" cannot patch resource "lockgrants"`)),
	} {
		if r := denial.Refusal(err); r != nil {
			t.Errorf("%s: Refusal(%v) = %v, want nil", name, err, r)
		}
		if w := denial.Wrap(err); w != err { //nolint:errorlint // Wrap must return the very same error
			t.Errorf("%s: Wrap changed the error", name)
		}
	}
}
