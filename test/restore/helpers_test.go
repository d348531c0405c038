package restore

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// waitTimeout bounds every wait for the controller or the API server.
const waitTimeout = 60 * time.Second

// actor is one workload identity, authenticated by a client certificate:
// system:serviceaccount:billing:NAME.
type actor struct {
	name       string
	c          client.WithWatch
	kubeconfig string
}

var (
	actorsMu sync.Mutex
	actors   = map[string]*actor{}
)

// as returns the actor for service account name of namespace billing.
func as(t *testing.T, name string) *actor {
	t.Helper()
	actorsMu.Lock()
	defer actorsMu.Unlock()
	user := "system:serviceaccount:billing:" + name
	if a, ok := actors[user]; ok {
		return a
	}
	cfg, kubeconfig, err := cp.addUser(envtest.User{Name: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:billing"}}, runDir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	a := &actor{name: user, c: c, kubeconfig: kubeconfig}
	actors[user] = a
	return a
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := admin.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// waitUntil polls cond until it holds, fails or the deadline passes.
func waitUntil(t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitTimeout, true, cond); err != nil {
		t.Fatalf("waiting until %s: %v", what, err)
	}
}

// acquire creates a LockGrant for resource as a; it does not wait.
func acquire(t *testing.T, a *actor, ns, resource string, ttlSeconds int32) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "grant-"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: ttlSeconds},
	}
	if err := a.c.Create(t.Context(), g); err != nil {
		t.Fatalf("%s acquiring %s: %v", a.name, resource, err)
	}
	return g
}

// waitGrant reads g (directly from the API server) until ok holds.
func waitGrant(t *testing.T, g *lockingv1alpha1.LockGrant, what string, ok func(*lockingv1alpha1.LockGrant) bool) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			return false, nil // the API server may be restarting
		}
		return ok(cur), nil
	})
	if err != nil {
		t.Fatalf("grant %s never became %s (last status %+v): %v", g.Name, what, cur.Status, err)
	}
	return cur
}

func waitPhase(t *testing.T, g *lockingv1alpha1.LockGrant, p lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
	t.Helper()
	return waitGrant(t, g, string(p), func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase == p })
}

// held acquires resource as a and waits until the grant is Held.
func held(t *testing.T, a *actor, ns, resource string, ttlSeconds int32) *lockingv1alpha1.LockGrant {
	t.Helper()
	return waitPhase(t, acquire(t, a, ns, resource, ttlSeconds), lockingv1alpha1.PhaseHeld)
}

// patchGrant sends a merge patch for exactly this acquisition, as a: the
// UID in the patch is a precondition.
func patchGrant(ctx context.Context, a *actor, g *lockingv1alpha1.LockGrant, patch map[string]any) error {
	meta, _ := patch["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["uid"] = g.UID
	patch["metadata"] = meta
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	target := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}
	return a.c.Patch(ctx, target, client.RawPatch(types.MergePatchType, body))
}

// release releases g as a and waits until it is Released.
func release(t *testing.T, a *actor, g *lockingv1alpha1.LockGrant) *lockingv1alpha1.LockGrant {
	t.Helper()
	if err := patchGrant(t.Context(), a, g, map[string]any{"spec": map[string]any{"release": true}}); err != nil {
		t.Fatalf("%s releasing %s: %v", a.name, g.Name, err)
	}
	return waitPhase(t, g, lockingv1alpha1.PhaseReleased)
}

// renew asks for one more renewal of g, as a.
func renew(ctx context.Context, a *actor, g *lockingv1alpha1.LockGrant) error {
	cur := &lockingv1alpha1.LockGrant{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
		return err
	}
	return patchGrant(ctx, a, g, map[string]any{"spec": map[string]any{"renewals": cur.Spec.Renewals + 1}})
}

// fenceOf is the grant's fence as the annotation carries it.
func fenceOf(g *lockingv1alpha1.LockGrant) string {
	return strconv.FormatInt(g.Status.FenceToken, 10)
}

// guardedWrite makes a guarded write of ConfigMap name as a, under grant g
// and its fence, setting data["result"]: create when it does not exist,
// else a read-modify-write update.
func guardedWrite(ctx context.Context, a *actor, ns, name, resource string, g *lockingv1alpha1.LockGrant, result string) error {
	cm := &corev1.ConfigMap{}
	err := a.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cm)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	create := apierrors.IsNotFound(err)
	if create {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	metav1.SetMetaDataLabel(&cm.ObjectMeta, lockingv1alpha1.GuardedLabel, "true")
	metav1.SetMetaDataAnnotation(&cm.ObjectMeta, lockingv1alpha1.ResourceAnnotation, resource)
	metav1.SetMetaDataAnnotation(&cm.ObjectMeta, lockingv1alpha1.GrantAnnotation, g.Name)
	metav1.SetMetaDataAnnotation(&cm.ObjectMeta, lockingv1alpha1.FenceAnnotation, fenceOf(g))
	cm.Data = map[string]string{"result": result}
	if create {
		return a.c.Create(ctx, cm)
	}
	return a.c.Update(ctx, cm)
}

// configMap reads a ConfigMap as admin; nil when absent.
func configMap(t *testing.T, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return cm
}

var reasonRE = regexp.MustCompile(`\b(NO_FENCE|NO_RESOURCE|UNKNOWN_GRANT|BINDING_MISMATCH|NOT_OWNER|STALE_OWNER|EXPIRED|NOT_HELD|ALREADY_ENDED|FENCE_REGRESSION|BAD_SIGNATURE|REVOKED_EPOCH|REVOKED|SEQUENCE_GAP|SEGMENT_CONFLICT)\b`)

// reason is the reason code of a refusal ("" for nil or no code).
func reason(err error) string {
	if err == nil {
		return ""
	}
	return reasonRE.FindString(err.Error())
}

// wantReason fails the test unless err is a refusal with reason want.
func wantReason(t *testing.T, what string, err error, want string) {
	t.Helper()
	if got := reason(err); got != want {
		t.Fatalf("%s: got %v; want a refusal %s", what, err, want)
	}
}
