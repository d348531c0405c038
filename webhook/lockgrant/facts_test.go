package lockgrant_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
	"github.com/lockwarden/lockwarden/webhook/lockgrant"
)

// objects is a reader of a few objects by name; a missing one is NotFound.
type objects map[string]client.Object

func (o objects) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	found, ok := o[key.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	switch out := obj.(type) {
	case *coordinationv1.Lease:
		found.(*coordinationv1.Lease).DeepCopyInto(out)
	case *corev1.Namespace:
		found.(*corev1.Namespace).DeepCopyInto(out)
	case *lockingv1alpha1.GuardPolicy:
		found.(*lockingv1alpha1.GuardPolicy).DeepCopyInto(out)
	default:
		return errors.New("unexpected type")
	}
	return nil
}

func (objects) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// authorizer answers every SubjectAccessReview with allowed and counts them.
type authorizer struct {
	client.Client
	allowed bool
	asked   *int
}

func (a authorizer) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	*a.asked++
	obj.(*authorizationv1.SubjectAccessReview).Status.Allowed = a.allowed
	return nil
}

// TestValidateCreateReadsTheFacts checks that the session Lease and the
// GuardPolicy a request names are read into the rules' facts, and that each
// refusal comes back as the error its reason calls for.
func TestValidateCreateReadsTheFacts(t *testing.T) {
	lease := func(name, uid, holder string, labeled bool, seconds *int32) *coordinationv1.Lease {
		l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: seconds}}
		l.Name, l.Namespace, l.UID = name, "ns", types.UID("u-"+uid)
		if holder != "" {
			l.Spec.HolderIdentity = ptr.To(holder)
		}
		if labeled {
			l.Labels = map[string]string{lockingv1alpha1.SessionLabel: "true"}
		}
		return l
	}
	pol := &lockingv1alpha1.GuardPolicy{Spec: lockingv1alpha1.GuardPolicySpec{MaxLeaseDurationSeconds: 30,
		Holders: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}}}}
	pol.Name = "settlement"
	v := &lockgrant.Validator{
		Clock: clocktesting.NewFakePassiveClock(time.Unix(0, 0)),
		Sessions: objects{
			"live":        lease("live", "1", "alice", true, ptr.To[int32](5)),
			"bob":         lease("bob", "1", "bob", true, ptr.To[int32](5)),
			"unlabeled":   lease("unlabeled", "1", "alice", false, ptr.To[int32](5)),
			"no-duration": lease("no-duration", "1", "alice", true, nil),
			"no-holder":   lease("no-holder", "1", "", true, ptr.To[int32](5)),
		},
		Reader: objects{"settlement": pol},
	}
	tests := []struct {
		name    string
		owner   string
		session string
		uid     string
		policy  string
		ttl     int32
		code    fencing.Reason // a Forbidden refusal
		field   string         // an Invalid refusal
	}{
		{"another owner", "bob", "", "", "", 10, fencing.ReasonNotOwner, ""},
		{"own live session", "alice", "live", "u-1", "", 10, "", ""},
		{"missing session", "alice", "gone", "u-1", "", 10, fencing.ReasonSessionExpired, ""},
		{"replaced session", "alice", "live", "u-0", "", 10, fencing.ReasonSessionExpired, ""},
		{"not a session", "alice", "unlabeled", "u-1", "", 10, "", "spec.session.name"},
		{"no duration", "alice", "no-duration", "u-1", "", 10, "", "spec.session.name"},
		{"someone else's session", "alice", "bob", "u-1", "", 10, fencing.ReasonNotOwner, ""},
		{"session without holder", "alice", "no-holder", "u-1", "", 10, fencing.ReasonNotOwner, ""},
		{"policy holder", "alice", "", "", "settlement", 30, "", ""},
		{"no such policy", "alice", "", "", "nope", 10, "", "spec.policy"},
		{"lease longer than the policy allows", "alice", "", "", "settlement", 31, "", "spec.leaseDurationSeconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := &lockingv1alpha1.LockGrant{Spec: lockingv1alpha1.LockGrantSpec{Resource: "r", LeaseDurationSeconds: tc.ttl, Owner: tc.owner, Policy: tc.policy}}
			g.Name, g.Namespace = "g-1", "ns"
			if tc.session != "" {
				g.Spec.Session = &lockingv1alpha1.SessionRef{Name: tc.session, UID: tc.uid}
			}
			_, err := v.ValidateCreate(asUser("alice", admissionv1.Create), g)
			switch {
			case tc.field != "":
				wantField(t, statusOf(t, err), tc.field, fencing.ReasonInvalidSpec)
			case tc.code != "":
				if !apierrors.IsForbidden(err) || denial.Reason(err) != tc.code {
					t.Fatalf("%v: want Forbidden %s", err, tc.code)
				}
			case err != nil:
				t.Fatalf("refused: %v", err)
			}
		})
	}
}

// TestValidateDeleteAsksOnlyWhatItNeeds checks who may delete a grant, and
// that the namespace and the force-release permission are asked only when
// the answer matters.
func TestValidateDeleteAsksOnlyWhatItNeeds(t *testing.T) {
	gone := metav1.Now()
	ns := objects{
		"ns":          &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		"terminating": &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "terminating", DeletionTimestamp: &gone}},
	}
	tests := []struct {
		name      string
		caller    string
		namespace string
		phase     lockingv1alpha1.LockGrantPhase
		allowed   bool
		asks      int
		warns     bool
		code      fencing.Reason
		requestID string
		generated bool
	}{
		{"the owner", "alice", "ns", lockingv1alpha1.PhaseHeld, false, 0, false, "", "", false},
		{"an ended grant", "bob", "ns", lockingv1alpha1.PhaseReleased, false, 0, false, "", "", false},
		{"with its namespace", "bob", "terminating", lockingv1alpha1.PhaseHeld, false, 0, false, "", "", false},
		{"forced release", "bob", "ns", lockingv1alpha1.PhaseHeld, true, 1, true, "", "", false},
		{"without the verb", "bob", "ns", lockingv1alpha1.PhaseHeld, false, 1, false, fencing.ReasonNotOwner, "", false},
		{"namespace unreadable", "bob", "missing", lockingv1alpha1.PhaseHeld, false, 1, false, fencing.ReasonNotOwner, "", false},
		// The owner's delete of its live grant of a request ID it chose
		// would forget the ID: refused. One its client generated, or a
		// gated Pod's, is nobody's to reuse.
		{"the owner, a chosen request ID", "alice", "ns", lockingv1alpha1.PhaseHeld, false, 0, false, fencing.ReasonRequestIDLive, "nightly-1", false},
		{"the owner, a chosen request ID, waiting", "alice", "ns", "", false, 0, false, fencing.ReasonRequestIDLive, "nightly-1", false},
		{"the owner, a generated request ID", "alice", "ns", lockingv1alpha1.PhaseHeld, false, 0, false, "", "gen-1", true},
		{"the owner, a gated Pod's request ID", "alice", "ns", lockingv1alpha1.PhaseHeld, false, 0, false, "", lockingv1alpha1.PodRequestID("u-1"), false},
		// A user's own ID that starts with "pod-" is still the user's:
		// only the grant the manager stewards for a Pod is a Pod's.
		{"the owner, a chosen request ID starting with pod-", "alice", "ns", lockingv1alpha1.PhaseHeld, false, 0, false, fencing.ReasonRequestIDLive, "pod-nightly-1", false},
		{"the owner, an ended grant of a chosen request ID", "alice", "ns", lockingv1alpha1.PhaseReleased, false, 0, false, "", "nightly-1", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			asked := 0
			v := &lockgrant.Validator{Reader: ns, Authorizer: authorizer{allowed: tc.allowed, asked: &asked}}
			g := &lockingv1alpha1.LockGrant{Spec: lockingv1alpha1.LockGrantSpec{Resource: "r", Owner: "alice", RequestID: tc.requestID}}
			g.Name, g.Namespace, g.Status.Phase = "g-1", tc.namespace, tc.phase
			if tc.generated {
				g.Annotations = map[string]string{lockingv1alpha1.GeneratedRequestIDAnnotation: "true"}
			}
			if strings.HasPrefix(tc.name, "the owner, a gated Pod's") {
				// Admission stamps the manager as steward on a Pod's grant.
				g.Annotations = map[string]string{lockingv1alpha1.StewardAnnotation: "system:serviceaccount:lockwarden-system:manager"}
			}
			warnings, err := v.ValidateDelete(asUser(tc.caller, admissionv1.Delete), g)
			if tc.code != "" {
				if !apierrors.IsForbidden(err) || denial.Reason(err) != tc.code {
					t.Fatalf("%v: want Forbidden %s", err, tc.code)
				}
			} else if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if asked != tc.asks || (len(warnings) > 0) != tc.warns {
				t.Fatalf("%d authorizations, warnings %q; want %d, warnings %v", asked, warnings, tc.asks, tc.warns)
			}
		})
	}
}

// A forced release is logged, at the default level, only when it happens:
// its dry run (kubectl delete --dry-run=server) gets the same warning and
// is logged at verbosity 1 only.
func TestForcedReleaseDryRunIsNotLoggedAsOne(t *testing.T) {
	ns := objects{"ns": &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}}
	for _, dryRun := range []bool{false, true} {
		var logged []string
		log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{Verbosity: 0})
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Delete, UserInfo: authenticationv1.UserInfo{Username: "bob"}, DryRun: ptr.To(dryRun),
		}}
		ctx := logf.IntoContext(admission.NewContextWithRequest(context.Background(), req), log)
		asked := 0
		v := &lockgrant.Validator{Reader: ns, Authorizer: authorizer{allowed: true, asked: &asked}}
		g := &lockingv1alpha1.LockGrant{Spec: lockingv1alpha1.LockGrantSpec{Resource: "r", Owner: "alice"}}
		g.Name, g.Namespace, g.Status.Phase = "g-1", "ns", lockingv1alpha1.PhaseHeld
		warnings, err := v.ValidateDelete(ctx, g)
		if err != nil || len(warnings) != 1 {
			t.Fatalf("dry run %v: %v, warnings %q; want the forced release allowed with its warning", dryRun, err, warnings)
		}
		switch {
		case dryRun && len(logged) != 0:
			t.Fatalf("a dry-run forced release was logged at the default level: %q", logged)
		case !dryRun && (len(logged) != 1 || !strings.Contains(logged[0], `"Forced release"`)):
			t.Fatalf("a forced release logged %q, want it once", logged)
		}
	}
}
