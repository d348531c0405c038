package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

const resource = "invoice-batch/2026-07-19"

// actor is one workload identity, e.g. system:serviceaccount:billing:a.
type actor struct {
	name string
	c    client.Client
}

var (
	actorsMu sync.Mutex
	actors   = map[string]*actor{}
)

// as returns a client that acts as service account NAME of namespace billing.
func as(t *testing.T, name string) *actor {
	t.Helper()
	actorsMu.Lock()
	defer actorsMu.Unlock()
	user := "system:serviceaccount:billing:" + name
	if a, ok := actors[user]; ok {
		return a
	}
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:billing"}}
	cl, err := client.New(c, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	a := &actor{name: user, c: cl}
	actors[user] = a
	return a
}

// timeline steps the shared fake clock relative to a test's t=0.
type timeline struct{ base time.Time }

func startTimeline() timeline { return timeline{base: clk.Now()} }

// at moves the clock to t=s seconds of the test.
func (tl timeline) at(s float64) {
	clk.SetTime(tl.base.Add(time.Duration(s * float64(time.Second))))
}

func (tl timeline) t(s float64) time.Time {
	return tl.base.Add(time.Duration(s * float64(time.Second)))
}

// acquire creates a LockGrant as a.
func acquire(t *testing.T, a *actor, ns string, ttl int32, mutate ...func(*lockingv1alpha1.LockGrant)) (*lockingv1alpha1.LockGrant, error) {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "grant-"},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: ttl},
	}
	for _, m := range mutate {
		m(g)
	}
	err := a.c.Create(t.Context(), g)
	return g, err
}

// mustAcquire acquires and waits until the grant is Held.
func mustAcquire(t *testing.T, a *actor, ns string, ttl int32) *lockingv1alpha1.LockGrant {
	t.Helper()
	g, err := acquire(t, a, ns, ttl)
	if err != nil {
		t.Fatalf("%s acquiring: %v", a.name, err)
	}
	return waitPhase(t, g, lockingv1alpha1.PhaseHeld)
}

// waitFor polls the grant until ok holds or a deadline passes.
func waitFor(t *testing.T, g *lockingv1alpha1.LockGrant, what string, ok func(*lockingv1alpha1.LockGrant) bool) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			return false, err
		}
		return ok(cur), nil
	})
	if err != nil {
		t.Fatalf("grant %s never became %s (last status %+v): %v", g.Name, what, cur.Status, err)
	}
	counterCached(t, cur.Namespace, cur.HeldFencedResource())
	return cur
}

// counterCached waits until the manager's cache shows the FenceCounter of
// fenced resource ID resource in ns as the API server stores it. A status
// follows its counter, and the guarded-write webhook accepts from the
// cached counter (--guard-reads=cached): a test that saw a grant end and
// then expects its writes refused waits out the manager's watch lag here,
// as docs/grant-path.md says a user must.
func counterCached(t *testing.T, ns, resource string) {
	t.Helper()
	key := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(resource)}
	var stored, cached lockingv1alpha1.FenceCounter
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		errStored, errCached := admin.Get(ctx, key, &stored), env.Cache.Get(ctx, key, &cached)
		switch {
		case apierrors.IsNotFound(errStored):
			return true, nil
		case errStored != nil:
			return false, errStored
		case errCached != nil:
			return false, client.IgnoreNotFound(errCached)
		}
		return cached.ResourceVersion == stored.ResourceVersion, nil
	})
	if err != nil {
		t.Fatalf("the manager's cache never showed counter %s at version %s (it shows %s): %v", key, stored.ResourceVersion, cached.ResourceVersion, err)
	}
}

func waitPhase(t *testing.T, g *lockingv1alpha1.LockGrant, p lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
	t.Helper()
	return waitFor(t, g, string(p), func(g *lockingv1alpha1.LockGrant) bool { return g.Status.Phase == p })
}

// get reads a grant as admin.
func get(t *testing.T, g *lockingv1alpha1.LockGrant) *lockingv1alpha1.LockGrant {
	t.Helper()
	cur := &lockingv1alpha1.LockGrant{}
	if err := admin.Get(t.Context(), client.ObjectKeyFromObject(g), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

// patchGrant sends a merge patch for exactly this acquisition: the UID in the
// patch is a precondition, so it can never reach a later grant.
func patchGrant(t *testing.T, a *actor, g *lockingv1alpha1.LockGrant, spec map[string]any) error {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": g.UID}, "spec": spec})
	target := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}
	return a.c.Patch(t.Context(), target, client.RawPatch(types.MergePatchType, body))
}

// renew asks for one more renewal of g, as a.
func renew(t *testing.T, a *actor, g *lockingv1alpha1.LockGrant) error {
	t.Helper()
	cur := get(t, g)
	return patchGrant(t, a, g, map[string]any{"renewals": cur.Spec.Renewals + 1})
}

// release releases g, as a.
func release(t *testing.T, a *actor, g *lockingv1alpha1.LockGrant) error {
	t.Helper()
	return patchGrant(t, a, g, map[string]any{"release": true})
}

// wake touches the grant so the controller reconciles its resource, as the
// RequeueAfter timer would once the fake clock passed a deadline.
func wake(t *testing.T, g *lockingv1alpha1.LockGrant) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"annotations":{"test.lockwarden.io/wake":"%d"}}}`, time.Now().UnixNano())
	if err := admin.Patch(t.Context(), &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
		t.Fatal(err)
	}
}

// write makes a guarded write of the ConfigMap name, as a, under grant g
// with the given fence annotation: create when it does not exist, else update.
func write(t *testing.T, a *actor, ns, name string, g *lockingv1alpha1.LockGrant, fence, data string) error {
	t.Helper()
	return writeCM(t, a, ns, name, data, map[string]string{
		lockingv1alpha1.ResourceAnnotation: resource,
		lockingv1alpha1.GrantAnnotation:    g.Name,
		lockingv1alpha1.FenceAnnotation:    fence,
	}, map[string]string{lockingv1alpha1.GuardedLabel: "true"})
}

// preDelete makes the holder's write that prepares a delete (intent
// "delete") and returns the resourceVersion it made.
func preDelete(t *testing.T, a *actor, ns, name string, g *lockingv1alpha1.LockGrant) string {
	t.Helper()
	if err := writeCM(t, a, ns, name, "deleting", map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.IntentAnnotation: fencing.IntentDelete,
	}, nil); err != nil {
		t.Fatalf("pre-delete write: %v", err)
	}
	return configMap(t, ns, name).ResourceVersion
}

// deleteAt deletes ConfigMap name as a with resourceVersion rv as
// precondition ("" for none).
func deleteAt(t *testing.T, a *actor, ns, name, rv string) error {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if rv == "" {
		return a.c.Delete(t.Context(), cm)
	}
	return a.c.Delete(t.Context(), cm, client.Preconditions{ResourceVersion: &rv})
}

// writeCM creates or updates ConfigMap name as a, setting the given
// annotations and labels (an empty value deletes the key) and data.
func writeCM(t *testing.T, a *actor, ns, name, data string, annotations, labels map[string]string) error {
	t.Helper()
	cm := &corev1.ConfigMap{}
	err := a.c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, cm)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	create := apierrors.IsNotFound(err)
	if create {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	for k, v := range labels {
		cm.Labels[k] = v
		if v == "" {
			delete(cm.Labels, k)
		}
	}
	for k, v := range annotations {
		cm.Annotations[k] = v
		if v == "" {
			delete(cm.Annotations, k)
		}
	}
	cm.Data = map[string]string{"result": data}
	if create {
		return a.c.Create(t.Context(), cm)
	}
	return a.c.Update(t.Context(), cm)
}

// fenceOf formats a grant's fence as a write carries it.
func fenceOf(g *lockingv1alpha1.LockGrant) string { return fencing.FormatFence(g.Status.FenceToken) }

// readCM returns the guarded ConfigMap's data and recorded fence.
func readCM(t *testing.T, ns, name string) (string, string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data["result"], cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation]
}

var reasonRE = regexp.MustCompile(`\b(NO_FENCE|NO_RESOURCE|UNKNOWN_GRANT|BINDING_MISMATCH|NOT_OWNER|STALE_OWNER|EXPIRED|NOT_HELD|ALREADY_ENDED|FENCE_REGRESSION|BAD_SIGNATURE|REVOKED_EPOCH|REVOKED|SESSION_EXPIRED|INVALID_SPEC|INVALID_POLICY|COUNTER_PROTECTED|FENCE_NOT_ISSUED|SEQUENCE_EXHAUSTED|EPOCH_BEHIND|OVERRIDE_REFUSED|REQUEST_ID_LIVE)\b`)

// reason is the reason code of an admission denial, or "" for none. The code
// is in details.causes; the message must agree with it.
func reason(err error) string {
	if err == nil {
		return ""
	}
	inMessage := reasonRE.FindString(err.Error())
	if r := string(denial.Reason(err)); r != "" {
		if r != inMessage {
			return "MISMATCH(" + r + "/" + inMessage + ")"
		}
		return r
	}
	return inMessage
}

// wantReason fails the test unless err is a denial with reason want.
func wantReason(t *testing.T, what string, err error, want string) {
	t.Helper()
	if got := reason(err); got != want {
		t.Fatalf("%s: got %v, want a refusal %s", what, err, want)
	}
}

func counterOf(t *testing.T, ns string) *lockingv1alpha1.FenceCounter {
	t.Helper()
	c := &lockingv1alpha1.FenceCounter{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(resource)}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitUntil polls cond every 20 ms until it holds, for at most 30 s.
func waitUntil(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond()
	})
	if err != nil {
		t.Fatalf("waiting until %s: %v", what, err)
	}
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
