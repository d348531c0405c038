package integration

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// Bad LockGrants are refused with a clear error and nothing is created.
func TestBadGrantRequests(t *testing.T) {
	ns := namespace(t)
	a := as(t, "bad-a")
	tests := []struct {
		name   string
		mutate func(*lockingv1alpha1.LockGrant)
		want   string // substring of the error
	}{
		{"ttl 0", func(g *lockingv1alpha1.LockGrant) { g.Spec.LeaseDurationSeconds = 0 }, "leaseDurationSeconds"},
		{"negative ttl", func(g *lockingv1alpha1.LockGrant) { g.Spec.LeaseDurationSeconds = -5 }, "leaseDurationSeconds"},
		{"ttl over an hour", func(g *lockingv1alpha1.LockGrant) { g.Spec.LeaseDurationSeconds = 3601 }, "leaseDurationSeconds"},
		{"empty resource", func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = "" }, "resource"},
		{"oversized resource", func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = strings.Repeat("a", 201) }, "resource"},
		{"uppercase resource", func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = "Invoice/1" }, "resource"},
		{"empty segment", func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = "invoice//1" }, "resource"},
		{"path traversal", func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = "../etc" }, "resource"},
		{"spoofed owner", func(g *lockingv1alpha1.LockGrant) { g.Spec.Owner = "system:serviceaccount:billing:someone-else" }, "NOT_OWNER"},
		{"born renewed", func(g *lockingv1alpha1.LockGrant) { g.Spec.Renewals = 3 }, "renewals"},
		{"negative wait", func(g *lockingv1alpha1.LockGrant) { g.Spec.WaitTimeoutSeconds = -1 }, "waitTimeoutSeconds"},
		{"negative lock-delay", func(g *lockingv1alpha1.LockGrant) { g.Spec.LockDelaySeconds = -1 }, "spec.lockDelaySeconds"},
		{"lock-delay over an hour", func(g *lockingv1alpha1.LockGrant) { g.Spec.LockDelaySeconds = 3601 }, "spec.lockDelaySeconds"},
		{"bad request ID", func(g *lockingv1alpha1.LockGrant) { g.Spec.RequestID = "no spaces" }, "spec.requestID"},
		{"bad operation root", func(g *lockingv1alpha1.LockGrant) { g.Spec.OperationRoot = "sha256:beef" }, "spec.operationRoot"},
		{"bad operation class", func(g *lockingv1alpha1.LockGrant) { g.Spec.OperationClass = "Settle Up" }, "spec.operationClass"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := acquire(t, a, ns, 10, tc.mutate)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v, want an error mentioning %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "metadata.labels") {
				t.Fatalf("create: %v names a label the user never set", err)
			}
			// Every malformed field, the schema's bounds and patterns
			// included, is refused with the code, at the field.
			if tc.want != "NOT_OWNER" && (!strings.Contains(err.Error(), "INVALID_SPEC") || !strings.Contains(err.Error(), "spec."+strings.TrimPrefix(tc.want, "spec."))) {
				t.Fatalf("create: %v, want INVALID_SPEC at spec.%s", err, strings.TrimPrefix(tc.want, "spec."))
			}
		})
	}
	// Fields of the wrong JSON type, as kubectl apply sends them from YAML.
	for name, lease := range map[string]any{"fractional ttl": 1.5, "ttl as a string": "10"} {
		t.Run(name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": lockingv1alpha1.GroupVersion.String(), "kind": "LockGrant",
				"metadata": map[string]any{"namespace": ns, "generateName": "typed-"},
				"spec":     map[string]any{"resource": "invoice/typed", "leaseDurationSeconds": lease},
			}}
			err := a.c.Create(t.Context(), u)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.leaseDurationSeconds") ||
				!strings.Contains(err.Error(), "INVALID_SPEC: ") || strings.Contains(err.Error(), "json: cannot unmarshal") {
				t.Fatalf("create: %v, want Invalid naming spec.leaseDurationSeconds with INVALID_SPEC", err)
			}
		})
	}
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Fatalf("%d grants were created from bad requests", len(list.Items))
	}
}

// The owner is defaulted from the requester; spec is immutable but for
// renewals and release, which only the owner may change.
func TestGrantOwnershipAndImmutability(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, "own-a"), as(t, "own-b")
	tl.at(0)
	g := mustAcquire(t, a, ns, 10)
	if g.Spec.Owner != a.name {
		t.Fatalf("owner = %q, want the requester %q", g.Spec.Owner, a.name)
	}
	if g.Annotations[lockingv1alpha1.RequestedAtAnnotation] == "" {
		t.Fatal("the request time was not stamped")
	}
	wantReason(t, "renew by another identity", renew(t, b, g), "NOT_OWNER")
	if err := release(t, b, g); denial.Reason(err) != "NOT_OWNER" {
		t.Fatalf("release by another identity: %v, want NOT_OWNER in details.causes", err)
	}
	for field, value := range map[string]any{"resource": "other", "leaseDurationSeconds": 3600, "owner": b.name, "requestID": "x", "lockDelaySeconds": 5, "waitTimeoutSeconds": 9} {
		err := patchGrant(t, a, g, map[string]any{field: value})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec."+field+": ") || !strings.Contains(err.Error(), "INVALID_SPEC") {
			t.Errorf("changing spec.%s: %v, want Invalid with INVALID_SPEC at spec.%s", field, err, field)
		}
	}
	if err := patchGrant(t, a, g, map[string]any{"renewals": 3}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.renewals: ") {
		t.Errorf("renewals jumping by 3: %v, want Invalid at spec.renewals", err)
	}
	if err := patchGrant(t, a, g, map[string]any{"release": true}); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, g, lockingv1alpha1.PhaseReleased)
	if err := patchGrant(t, a, g, map[string]any{"release": false}); !apierrors.IsInvalid(err) {
		t.Errorf("unsetting release: %v, want Invalid", err)
	}
	cur := get(t, g)
	if cur.Spec.Renewals != 0 || cur.Status.FenceToken != 1 || cur.Spec.Resource != resource {
		t.Fatalf("refused changes left a trace: %+v", cur)
	}
}

// Malformed or missing fences, unknown grants, forged fences and writes by
// another identity are refused and leave the object as it was.
func TestBadGuardedWrites(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	a, b := as(t, "gw-a"), as(t, "gw-b")
	const obj = "guarded"
	tl.at(0)
	g := mustAcquire(t, a, ns, 30)
	if err := write(t, a, ns, obj, g, "1", "good"); err != nil {
		t.Fatal(err)
	}
	for _, fence := range []string{"", "abc", "01", "-1", "0", "1.5", " 1", "99999999999999999999"} {
		wantReason(t, "fence "+fence, write(t, a, ns, obj, g, fence, "bad"), "NO_FENCE")
	}
	forged := write(t, a, ns, obj, g, "9223372036854775807", "bad")
	wantReason(t, "forged huge fence", forged, "BINDING_MISMATCH")
	if denial.Reason(forged) != "BINDING_MISMATCH" {
		t.Fatalf("the denial carries no reason in details.causes: %#v", forged)
	}
	wantReason(t, "another identity", write(t, b, ns, obj, g, "1", "bad"), "NOT_OWNER")
	unknown := g.DeepCopy()
	unknown.Name = "no-such-grant"
	wantReason(t, "unknown grant", write(t, a, ns, obj, unknown, "1", "bad"), "UNKNOWN_GRANT")

	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: ns, Name: obj}
	if err := a.c.Get(t.Context(), key, cm); err != nil {
		t.Fatal(err)
	}
	noGrant := cm.DeepCopy()
	delete(noGrant.Annotations, lockingv1alpha1.GrantAnnotation)
	noGrant.Data["result"] = "bad"
	wantReason(t, "no grant annotation", a.c.Update(t.Context(), noGrant), "NO_FENCE")
	moved := cm.DeepCopy()
	moved.Annotations[lockingv1alpha1.ResourceAnnotation] = "another/resource"
	wantReason(t, "changing the resource", a.c.Update(t.Context(), moved), "BINDING_MISMATCH")
	unguard := cm.DeepCopy()
	delete(unguard.Labels, lockingv1alpha1.GuardedLabel)
	wantReason(t, "removing the guard label without a claim", b.c.Update(t.Context(), unguard), "NO_FENCE")
	unguard.Annotations[lockingv1alpha1.GrantAnnotation] = g.Name
	unguard.Annotations[lockingv1alpha1.FenceAnnotation] = "1"
	wantReason(t, "another identity removing the guard label under the holder's claim", b.c.Update(t.Context(), unguard), "NOT_OWNER")
	bad := &corev1.ConfigMap{}
	bad.Namespace, bad.Name = ns, "no-resource"
	bad.Labels = map[string]string{lockingv1alpha1.GuardedLabel: "true"}
	wantReason(t, "guarded object without a resource", a.c.Create(t.Context(), bad), "NO_RESOURCE")

	if data, fence := readCM(t, ns, obj); data != "good" || fence != "1" {
		t.Fatalf("object = %q at fence %s after refused writes, want good at 1", data, fence)
	}

	// Deleting: a pre-delete write by the holder, then a delete with its
	// resourceVersion, by the holder.
	wantReason(t, "bare delete by another identity", b.c.Delete(t.Context(), cm), "NO_FENCE")
	wantReason(t, "bare delete by the holder", a.c.Delete(t.Context(), cm), "NO_FENCE")
	rv := preDelete(t, a, ns, obj, g)
	wantReason(t, "delete by another identity after the holder's pre-delete write", deleteAt(t, b, ns, obj, rv), "NOT_OWNER")
	if err := deleteAt(t, a, ns, obj, rv); err != nil {
		t.Fatalf("delete by the holder: %v", err)
	}
}

// Nobody can lower a FenceCounter or delete it while its resource has grants.
func TestFenceCounterProtection(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	g := mustAcquire(t, as(t, "fc-a"), ns, 30)
	c := counterOf(t, ns)
	if c.Spec.Fence != 1 || c.Spec.Holder == nil || c.Spec.Holder.UID != string(g.UID) {
		t.Fatalf("counter = %+v, want fence 1 held by %s", c.Spec, g.Name)
	}
	lower := c.DeepCopy()
	lower.Spec.Fence = 0
	lower.Spec.Holder = nil
	if err := admin.Update(t.Context(), lower); err == nil || !strings.Contains(err.Error(), "never decrease") {
		t.Fatalf("lowering the fence as admin: %v, want refused", err)
	}
	if err := admin.Delete(t.Context(), c); reason(err) != "COUNTER_PROTECTED" {
		t.Fatalf("deleting the counter while grants exist: %v, want COUNTER_PROTECTED", err)
	}
	// Also once every grant is gone: a new counter would reissue fence 1.
	if err := admin.Delete(t.Context(), g); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(t.Context(), c); reason(err) != "COUNTER_PROTECTED" {
		t.Fatalf("deleting the counter with no grants left: %v, want COUNTER_PROTECTED", err)
	}
	iss := &lockingv1alpha1.FenceIssuer{}
	iss.Name = lockingv1alpha1.DefaultFenceIssuerName
	if err := admin.Delete(t.Context(), iss); reason(err) != "COUNTER_PROTECTED" {
		t.Fatalf("deleting the FenceIssuer: %v, want COUNTER_PROTECTED", err)
	}
	if err := as(t, "fc-a").c.Delete(t.Context(), c); !apierrors.IsForbidden(err) {
		t.Fatalf("a user deleting the counter: %v, want Forbidden by RBAC", err)
	}
	if got := counterOf(t, ns); got.Spec.Fence != 1 {
		t.Fatalf("counter fence = %d after refused changes, want 1", got.Spec.Fence)
	}
}

// Resource IDs are scoped to a namespace: a grant held in one namespace
// cannot write an object of another, even for the same resource ID, and so
// cannot lock out that namespace's own holder.
func TestGrantOfAnotherNamespaceIsRefused(t *testing.T) {
	home, away, tl := namespace(t), namespace(t), startTimeline()
	tl.at(0)
	a, x := as(t, "ns-a"), as(t, "ns-x")
	ga := mustAcquire(t, a, home, 30)
	if err := write(t, a, home, "ledger", ga, fenceOf(ga), "home"); err != nil {
		t.Fatal(err)
	}
	// x takes the same resource ID in its own namespace, twice, to get a
	// higher fence there, and points the home object at that grant.
	gx := mustAcquire(t, x, away, 30)
	if err := release(t, x, gx); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, gx, lockingv1alpha1.PhaseReleased)
	gx = mustAcquire(t, x, away, 30)
	foreign := gx.DeepCopy()
	foreign.Name = away + "/" + gx.Name
	wantReason(t, "a grant of another namespace", write(t, x, home, "ledger", foreign, fenceOf(gx), "hijack"), "BINDING_MISMATCH")
	if err := write(t, a, home, "ledger", ga, fenceOf(ga), "still home"); err != nil {
		t.Fatalf("the home holder was locked out: %v", err)
	}
}
