package admissionpolicy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// The suite's control plane: a real kube-apiserver and etcd with
// lockwarden's CRDs and the admission policy of config/policy, and no
// webhook, so that every verdict below is the policy's alone.
var (
	cfg    *rest.Config
	admin  client.Client
	scheme = runtime.NewScheme()
)

// The identities of the cases: the grants' owner, another user, and a user
// with the administer verb on lockgrants.
const (
	owner         = "alice"
	other         = "bob"
	administrator = "carol"
	// steward renews and releases the grants on their owner's behalf
	// (the manager, for a lock-gated Pod's grant).
	steward = "dave"
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	root, _ := filepath.Abs("../..")
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		os.Setenv("KUBEBUILDER_ASSETS", filepath.Join(root, "bin"))
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if cfg, err = env.Start(); err != nil {
		_ = env.Stop()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer env.Stop() //nolint:errcheck // best effort at exit
	if admin, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := setup(context.Background(), filepath.Join(root, "config", "policy", "lockgrant_updates.yaml")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// setup installs the policy and its binding as config/policy has them, and
// the users' rights: everyone may update lockgrants, administrator also has
// the administer verb.
func setup(ctx context.Context, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, part := range strings.Split(string(raw), "\n---") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(part), &u.Object); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := admin.Create(ctx, u); err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	roles := []*rbacv1.ClusterRole{
		{ObjectMeta: metav1.ObjectMeta{Name: "grant-users"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"get", "update", "patch"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "grant-administrators"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{fencing.AdministerVerb}}}},
	}
	subjects := map[string]rbacv1.Subject{
		"grant-users":          {Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"},
		"grant-administrators": {Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: administrator},
	}
	for _, r := range roles {
		if err := admin.Create(ctx, r); err != nil {
			return err
		}
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: r.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.Name},
			Subjects: []rbacv1.Subject{subjects[r.Name]}}
		if err := admin.Create(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

// as is a client acting as user.
func as(t *testing.T, user string) client.Client {
	t.Helper()
	rc := rest.CopyConfig(cfg)
	rc.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// state is a grant as a case finds it.
type state struct {
	name    string
	phase   lockingv1alpha1.LockGrantPhase
	release bool
}

var states = []state{
	{"new", "", false}, {"new-withdrawn", "", true}, {"pending", lockingv1alpha1.PhasePending, false},
	{"pending-withdrawn", lockingv1alpha1.PhasePending, true}, {"held", lockingv1alpha1.PhaseHeld, false},
	{"held-releasing", lockingv1alpha1.PhaseHeld, true}, {"expired", lockingv1alpha1.PhaseExpired, false},
	{"expired-released", lockingv1alpha1.PhaseExpired, true}, {"released", lockingv1alpha1.PhaseReleased, true},
	{"timed-out", lockingv1alpha1.PhaseTimedOut, false}, {"revoked", lockingv1alpha1.PhaseRevoked, false},
	{"revoked-released", lockingv1alpha1.PhaseRevoked, true},
}

// change is an update a case sends.
type change struct {
	name  string
	apply func(g *lockingv1alpha1.LockGrant)
}

var changes = []change{
	{"nothing", func(*lockingv1alpha1.LockGrant) {}},
	{"renew", func(g *lockingv1alpha1.LockGrant) { g.Spec.Renewals++ }},
	{"release", func(g *lockingv1alpha1.LockGrant) { g.Spec.Release = true }},
	{"renew and release", func(g *lockingv1alpha1.LockGrant) { g.Spec.Renewals++; g.Spec.Release = true }},
	{"label", func(g *lockingv1alpha1.LockGrant) { metav1.SetMetaDataLabel(&g.ObjectMeta, "team", "payments") }},
	{"annotation", func(g *lockingv1alpha1.LockGrant) {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, lockingv1alpha1.FenceRegressionAnnotation, "fence 3 after 7")
	}},
	{"finalizer", func(g *lockingv1alpha1.LockGrant) { g.Finalizers = append(g.Finalizers, "example.com/keep") }},
	{"owner reference", func(g *lockingv1alpha1.LockGrant) {
		g.OwnerReferences = append(g.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "parent", UID: "3b6a0c1e-0000-4000-8000-000000000001"})
	}},
	{"request time", func(g *lockingv1alpha1.LockGrant) {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, lockingv1alpha1.RequestedAtAnnotation, "2020-01-01T00:00:00Z")
	}},
	{"owner groups", func(g *lockingv1alpha1.LockGrant) {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, lockingv1alpha1.OwnerGroupsAnnotation, "system:masters")
	}},
	{"reused mark", func(g *lockingv1alpha1.LockGrant) {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, lockingv1alpha1.ReusedRequestIDAnnotation, "Released 2020-01-01T00:00:00Z")
	}},
	{"steward", func(g *lockingv1alpha1.LockGrant) {
		metav1.SetMetaDataAnnotation(&g.ObjectMeta, lockingv1alpha1.StewardAnnotation, other)
	}},
	{"generated mark", func(g *lockingv1alpha1.LockGrant) {
		delete(g.Annotations, lockingv1alpha1.GeneratedRequestIDAnnotation)
	}},
	{"request-ID label", func(g *lockingv1alpha1.LockGrant) {
		metav1.SetMetaDataLabel(&g.ObjectMeta, lockingv1alpha1.RequestIDLabel, "other")
	}},
	{"renew and label", func(g *lockingv1alpha1.LockGrant) {
		g.Spec.Renewals++
		metav1.SetMetaDataLabel(&g.ObjectMeta, "team", "payments")
	}},
}

// newGrant creates, as the administrator of the cluster, a grant owned by
// owner in state s: as admission and the controller would have left it.
func newGrant(t *testing.T, ns string, s state) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lockingv1alpha1.GrantNameForRequest("req-" + s.name),
			Labels: map[string]string{lockingv1alpha1.RequestIDLabel: "req-" + s.name},
			Annotations: map[string]string{
				lockingv1alpha1.RequestedAtAnnotation: "2026-07-19T00:00:00.123456Z", lockingv1alpha1.OwnerGroupsAnnotation: "system:authenticated",
				lockingv1alpha1.GeneratedRequestIDAnnotation: "true", lockingv1alpha1.StewardAnnotation: steward,
			}},
		Spec: lockingv1alpha1.LockGrantSpec{Resource: "invoices", Owner: owner, LeaseDurationSeconds: 30, RequestID: "req-" + s.name, Release: s.release},
	}
	if err := admin.Create(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	if s.phase != "" {
		g.Status.Phase = s.phase
		if s.phase != lockingv1alpha1.PhasePending {
			g.Status.FenceToken = 7
			exp := metav1.NewMicroTime(time.Date(2026, 7, 19, 0, 0, 30, 0, time.UTC))
			g.Status.ExpiresAt = &exp
		}
		if err := admin.Status().Update(t.Context(), g); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// verdict is the reason code an answer carries: "" for an accepted
// update. A 403 is read back as clients read it (pkg/fencing/denial); a
// 422 by the code its message starts with.
func verdict(t *testing.T, err error) fencing.Reason {
	t.Helper()
	var st apierrors.APIStatus
	switch {
	case err == nil:
		return ""
	case apierrors.IsForbidden(err):
		r := denial.Refusal(err)
		if r == nil {
			t.Fatalf("a 403 without a reason code a client can read: %v", err)
		}
		return r.Reason
	case errors.As(err, &st) && st.Status().Code == http.StatusUnprocessableEntity:
		msg := st.Status().Message
		i := strings.Index(msg, string(fencing.ReasonInvalidSpec)+": ")
		if i < 0 {
			t.Fatalf("a 422 without a reason code: %v", err)
		}
		return fencing.ReasonInvalidSpec
	}
	t.Fatalf("unexpected answer: %v", err)
	return ""
}

// Every update of a grant gets, from the admission policy in the API
// server, the verdict fencing.CheckGrantUpdate gives on the same facts: the
// same reason code, or none. The cases are every state a grant can be in
// (its phase, and whether its owner asked to release), every kind of
// change (renew, release, metadata, the immutable stamps), by its owner,
// by its steward, by another identity and by one with the administer verb. Sent as dry
// runs, so each grant serves every case.
func TestPolicyAgreesWithFencing(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vap-"}}
	if err := admin.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	clients := map[string]client.Client{owner: as(t, owner), other: as(t, other), administrator: as(t, administrator), steward: as(t, steward)}
	waitForPolicy(t, ns.Name, clients[other])
	allowed, refused := 0, map[fencing.Reason]int{}
	for _, s := range states {
		g := newGrant(t, ns.Name, s)
		for _, ch := range changes {
			for _, caller := range []string{owner, other, administrator, steward} {
				t.Run(s.name+"/"+ch.name+"/"+caller, func(t *testing.T) {
					next := g.DeepCopy()
					ch.apply(next)
					want := fencing.ReasonOf(fencing.CheckGrantUpdate(facts.GrantUpdate(caller, g, next, func() (bool, error) {
						return caller == administrator, nil
					})))
					err := clients[caller].Patch(t.Context(), next.DeepCopy(), client.MergeFrom(g), client.DryRunAll)
					if got := verdict(t, err); got != want {
						t.Fatalf("the policy answers %q (%v), fencing.CheckGrantUpdate %q", got, err, want)
					}
					if want == "" {
						allowed++
					} else {
						refused[want]++
					}
				})
			}
		}
	}
	// The table covers every verdict the rules give.
	for _, r := range []fencing.Reason{fencing.ReasonInvalidSpec, fencing.ReasonNotOwner, fencing.ReasonNotHeld, fencing.ReasonExpired,
		fencing.ReasonAlreadyEnded, fencing.ReasonRevoked} {
		if refused[r] == 0 {
			t.Errorf("no case is refused %s", r)
		}
	}
	if allowed == 0 {
		t.Error("no case is allowed")
	}
}

// waitForPolicy waits until the API server enforces the policy: a release
// by someone other than the owner is refused.
func waitForPolicy(t *testing.T, ns string, c client.Client) {
	t.Helper()
	g := newGrant(t, ns, state{name: "probe", phase: lockingv1alpha1.PhaseHeld})
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		next := g.DeepCopy()
		next.Spec.Release = true
		return apierrors.IsForbidden(c.Patch(ctx, next, client.MergeFrom(g), client.DryRunAll)), nil
	})
	if err != nil {
		t.Fatal("the admission policy never took effect")
	}
	// An expression that fails at run time (the policy fails closed)
	// shows as a refusal without a reason code, which verdict rejects.
}
