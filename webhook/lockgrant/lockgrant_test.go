package lockgrant_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/webhook/lockgrant"
)

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := lockingv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// wantField checks that a refusal is a 422 Invalid whose causes name field
// and whose detail starts with code.
func wantField(t *testing.T, st *metav1.Status, field string, code fencing.Reason) {
	t.Helper()
	if st == nil || st.Code != http.StatusUnprocessableEntity || st.Reason != metav1.StatusReasonInvalid {
		t.Fatalf("status = %+v, want 422 Invalid", st)
	}
	if st.Details == nil {
		t.Fatalf("status %q has no details", st.Message)
	}
	for _, c := range st.Details.Causes {
		if c.Field == field {
			if !strings.Contains(c.Message, string(code)+": ") {
				t.Fatalf("cause of %s = %q, want it to carry %s", field, c.Message, code)
			}
			if strings.Contains(st.Message, "json: cannot unmarshal") {
				t.Fatalf("message %q is the decoder's Go error", st.Message)
			}
			return
		}
	}
	t.Fatalf("status %q names no field %s (causes %+v)", st.Message, field, st.Details.Causes)
}

// The mutating webhook answers a LockGrant it cannot decode, or one whose
// string fields the schema would refuse (the schema's own message has no
// code), with INVALID_SPEC naming the user's field.
func TestDefaulterRefusesMalformedFields(t *testing.T) {
	wh := lockgrant.NewDefaulter(scheme(t), clocktesting.NewFakePassiveClock(time.Unix(0, 0)), nil)
	grant := func(spec string) []byte {
		return []byte(`{"apiVersion":"locking.lockwarden.io/v1alpha1","kind":"LockGrant","metadata":{"namespace":"ns","generateName":"g-"},"spec":` + spec + `}`)
	}
	tests := []struct {
		name  string
		raw   []byte
		field string // "" means allowed
	}{
		{"a fractional lease", grant(`{"resource":"r","leaseDurationSeconds":1.5}`), "spec.leaseDurationSeconds"},
		{"a lease as a string", grant(`{"resource":"r","leaseDurationSeconds":"10"}`), "spec.leaseDurationSeconds"},
		{"renewals as a string", grant(`{"resource":"r","leaseDurationSeconds":10,"renewals":"1"}`), "spec.renewals"},
		{"release as a string", grant(`{"resource":"r","leaseDurationSeconds":10,"release":"no"}`), "spec.release"},
		{"a requestID that is not a label value", grant(`{"resource":"r","leaseDurationSeconds":10,"requestID":"` + strings.Repeat("x", 64) + `"}`), "spec.requestID"},
		{"a requestID with a slash", grant(`{"resource":"r","leaseDurationSeconds":10,"requestID":"a/b"}`), "spec.requestID"},
		{"a resource ID with capitals", grant(`{"resource":"Batch/7","leaseDurationSeconds":10}`), "spec.resource"},
		{"a resource ID with an empty segment", grant(`{"resource":"batch//7","leaseDurationSeconds":10}`), "spec.resource"},
		{"a resource ID over 200 bytes", grant(`{"resource":"` + strings.Repeat("r", 201) + `","leaseDurationSeconds":10}`), "spec.resource"},
		{"an empty resource ID", grant(`{"resource":"","leaseDurationSeconds":10}`), "spec.resource"},
		{"an operationRoot that is no digest", grant(`{"resource":"r","leaseDurationSeconds":10,"operationRoot":"sha256:xyz"}`), "spec.operationRoot"},
		{"an operationClass with capitals", grant(`{"resource":"r","leaseDurationSeconds":10,"operationClass":"Settle"}`), "spec.operationClass"},
		{"an owner over 253 bytes", grant(`{"resource":"r","leaseDurationSeconds":10,"owner":"` + strings.Repeat("o", 254) + `"}`), "spec.owner"},
		{"a session without a UID", grant(`{"resource":"r","leaseDurationSeconds":10,"session":{"name":"s","uid":""}}`), "spec.session.uid"},
		{"negative renewals", grant(`{"resource":"r","leaseDurationSeconds":10,"renewals":-1}`), "spec.renewals"},
		{"a well-formed request", grant(`{"resource":"batch/2026-07-19","leaseDurationSeconds":10,"requestID":"job-7","operationClass":"settlement","operationRoot":"sha256:` + strings.Repeat("ab", 32) + `"}`), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				UID: "1", Operation: admissionv1.Create, Namespace: "ns",
				Kind:     metav1.GroupVersionKind{Group: lockingv1alpha1.GroupVersion.Group, Version: "v1alpha1", Kind: "LockGrant"},
				Object:   runtime.RawExtension{Raw: tc.raw},
				UserInfo: authenticationv1.UserInfo{Username: "alice"},
			}}
			resp := wh.Handle(context.Background(), req)
			if tc.field == "" {
				if !resp.Allowed {
					t.Fatalf("refused: %+v", resp.Result)
				}
				return
			}
			if resp.Allowed {
				t.Fatal("allowed")
			}
			wantField(t, resp.Result, tc.field, fencing.ReasonInvalidSpec)
		})
	}
}

func asUser(user string, op admissionv1.Operation) context.Context {
	return admission.NewContextWithRequest(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, UserInfo: authenticationv1.UserInfo{Username: user},
	}})
}

func statusOf(t *testing.T, err error) *metav1.Status {
	t.Helper()
	var st apierrors.APIStatus
	if err == nil {
		t.Fatal("allowed")
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("%v: want an Invalid error", err)
	}
	if !asStatus(err, &st) {
		t.Fatalf("%v is not an API status", err)
	}
	s := st.Status()
	return &s
}

func asStatus(err error, st *apierrors.APIStatus) bool {
	s, ok := err.(apierrors.APIStatus) //nolint:errorlint // the webhook returns the status itself
	*st = s
	return ok
}

// A new grant that is already renewed, or that is named against its
// requestID, is refused with INVALID_SPEC naming each field. One created
// already released is a request withdrawn at birth: admitted.
func TestValidateCreateNamesTheField(t *testing.T) {
	v := &lockgrant.Validator{Clock: clocktesting.NewFakePassiveClock(time.Unix(0, 0))}
	base := func() *lockingv1alpha1.LockGrant {
		g := &lockingv1alpha1.LockGrant{Spec: lockingv1alpha1.LockGrantSpec{Resource: "r", LeaseDurationSeconds: 10, Owner: "alice"}}
		g.Name, g.Namespace = "g-1", "ns"
		return g
	}
	tests := []struct {
		name   string
		change func(*lockingv1alpha1.LockGrant)
		fields []string
	}{
		{"already renewed", func(g *lockingv1alpha1.LockGrant) { g.Spec.Renewals = 1 }, []string{"spec.renewals"}},
		{"renewed and released", func(g *lockingv1alpha1.LockGrant) { g.Spec.Renewals, g.Spec.Release = 2, true }, []string{"spec.renewals"}},
		{"named against its requestID", func(g *lockingv1alpha1.LockGrant) { g.Spec.RequestID = "job-7" }, []string{"metadata.name"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := base()
			tc.change(g)
			_, err := v.ValidateCreate(asUser("alice", admissionv1.Create), g)
			st := statusOf(t, err)
			for _, f := range tc.fields {
				wantField(t, st, f, fencing.ReasonInvalidSpec)
			}
			if n := len(st.Details.Causes); n != len(tc.fields) {
				t.Fatalf("%d causes, want %d: %+v", n, len(tc.fields), st.Details.Causes)
			}
		})
	}
	g := base()
	g.Spec.RequestID = "job-7"
	g.Name = lockingv1alpha1.GrantNameForRequest("job-7")
	if _, err := v.ValidateCreate(asUser("alice", admissionv1.Create), g); err != nil {
		t.Fatalf("a well-formed grant: %v", err)
	}
	g.Spec.Release = true
	if _, err := v.ValidateCreate(asUser("alice", admissionv1.Create), g); err != nil {
		t.Fatalf("a grant withdrawn at birth: %v", err)
	}
}

// The annotations and the request-ID label the defaulter set never change.
func TestValidateUpdateNamesImmutableMetadata(t *testing.T) {
	v := &lockgrant.Validator{Clock: clocktesting.NewFakePassiveClock(time.Unix(0, 0))}
	old := &lockingv1alpha1.LockGrant{Spec: lockingv1alpha1.LockGrantSpec{Resource: "r", LeaseDurationSeconds: 10, Owner: "alice", RequestID: "job-7"}}
	old.Name, old.Namespace = lockingv1alpha1.GrantNameForRequest("job-7"), "ns"
	old.Labels = map[string]string{lockingv1alpha1.RequestIDLabel: "job-7"}
	old.Annotations = map[string]string{lockingv1alpha1.RequestedAtAnnotation: "t0", lockingv1alpha1.OwnerGroupsAnnotation: "a,b"}
	tests := []struct {
		name   string
		change func(*lockingv1alpha1.LockGrant)
		field  string
	}{
		{"requested-at", func(g *lockingv1alpha1.LockGrant) { g.Annotations[lockingv1alpha1.RequestedAtAnnotation] = "t1" },
			"metadata.annotations[" + lockingv1alpha1.RequestedAtAnnotation + "]"},
		{"owner groups", func(g *lockingv1alpha1.LockGrant) { delete(g.Annotations, lockingv1alpha1.OwnerGroupsAnnotation) },
			"metadata.annotations[" + lockingv1alpha1.OwnerGroupsAnnotation + "]"},
		{"request-ID label", func(g *lockingv1alpha1.LockGrant) { g.Labels[lockingv1alpha1.RequestIDLabel] = "job-8" },
			"metadata.labels[" + lockingv1alpha1.RequestIDLabel + "]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := old.DeepCopy()
			tc.change(g)
			_, err := v.ValidateUpdate(asUser("alice", admissionv1.Update), old, g)
			wantField(t, statusOf(t, err), tc.field, fencing.ReasonInvalidSpec)
		})
	}
}
