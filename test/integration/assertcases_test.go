package integration

import (
	"math"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A stale holder leaves an unguarded look-alike with a forged record (and a
// forged claim); the real holder then puts it under guard: the forgery
// neither authorizes anything nor locks the holder out.
func TestForgedRecordOnUnguardedLookAlike(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "fg-a"), as(t, "fg-b")
	ga := mustAcquire(t, a, ns, 60)
	if err := write(t, a, ns, "cm-h01", ga, fenceOf(ga), "a"); err != nil {
		t.Fatal(err)
	}
	if err := release(t, a, ga); err != nil {
		t.Fatal(err)
	}
	gb := mustAcquire(t, b, ns, 60)
	if err := write(t, b, ns, "cm-h01", gb, fenceOf(gb), "b"); err != nil {
		t.Fatal(err)
	}
	rv := preDelete(t, b, ns, "cm-h01", gb)
	if err := deleteAt(t, b, ns, "cm-h01", rv); err != nil {
		t.Fatalf("the holder's delete: %v", err)
	}

	huge := fencing.FormatFence(math.MaxInt64)
	forged := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm-h01", Annotations: map[string]string{
		lockingv1alpha1.ResourceAnnotation:      resource,
		lockingv1alpha1.AcceptedGrantAnnotation: ns + "/" + ga.Name,
		lockingv1alpha1.AcceptedFenceAnnotation: huge,
		lockingv1alpha1.GrantAnnotation:         ga.Name,
		lockingv1alpha1.FenceAnnotation:         huge,
	}}, Data: map[string]string{"result": "forged"}}
	if err := a.c.Create(t.Context(), forged); err != nil {
		t.Fatalf("an unguarded object is anyone's to write: %v", err)
	}
	// A putting it under guard with the forged claim it already carries.
	wantReason(t, "guarding the look-alike with its own forged claim",
		writeCM(t, a, ns, "cm-h01", "stale", nil, map[string]string{lockingv1alpha1.GuardedLabel: "true"}), "NO_FENCE")
	// B applies it as the README shows: accepted, recorded at B's fence.
	if err := write(t, b, ns, "cm-h01", gb, fenceOf(gb), "b-again"); err != nil {
		t.Fatalf("the real holder was locked out by a forged record: %v", err)
	}
	if data, fence := readCM(t, ns, "cm-h01"); data != "b-again" || fence != fenceOf(gb) {
		t.Fatalf("object = %q at fence %s, want b-again at %s", data, fence, fenceOf(gb))
	}

	// A look-alike squatting B's next claim (its grant and fence, readable
	// from the LockGrant) cannot lock B out: B's claim carries a fresh
	// write ID, as pkg/lock's Stamp sets one.
	rv = preDelete(t, b, ns, "cm-h01", gb)
	if err := deleteAt(t, b, ns, "cm-h01", rv); err != nil {
		t.Fatal(err)
	}
	squat := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cm-h01", Annotations: map[string]string{
		lockingv1alpha1.ResourceAnnotation: resource, lockingv1alpha1.GrantAnnotation: gb.Name, lockingv1alpha1.FenceAnnotation: fenceOf(gb),
	}}, Data: map[string]string{"result": "squatted"}}
	if err := a.c.Create(t.Context(), squat); err != nil {
		t.Fatal(err)
	}
	fresh := map[string]string{lockingv1alpha1.WriteIDAnnotation: "b-7f3a"}
	if err := writeCM(t, b, ns, "cm-h01", "b-after-squat", fresh, map[string]string{lockingv1alpha1.GuardedLabel: "true"}); err != nil {
		t.Fatalf("the holder's claim with a fresh write ID was refused: %v", err)
	}
}

// A previous holder's proof never refuses the next holder's write.
func TestPreviousHoldersProofDoesNotBlock(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "pp-a"), as(t, "pp-b")
	ga := mustAcquire(t, a, ns, 60)
	withProof := map[string]string{
		lockingv1alpha1.ResourceAnnotation: resource, lockingv1alpha1.GrantAnnotation: ga.Name,
		lockingv1alpha1.FenceAnnotation: fenceOf(ga), lockingv1alpha1.ProofAnnotation: ga.Status.Proof,
	}
	if err := writeCM(t, a, ns, "proofed", "a", withProof, map[string]string{lockingv1alpha1.GuardedLabel: "true"}); err != nil {
		t.Fatalf("A's proven write: %v", err)
	}
	if _, ok := configMap(t, ns, "proofed").Annotations[lockingv1alpha1.ProofAnnotation]; ok {
		t.Fatal("the accepted write left its proof on the object")
	}
	if err := release(t, a, ga); err != nil {
		t.Fatal(err)
	}
	gb := mustAcquire(t, b, ns, 60)
	if err := write(t, b, ns, "proofed", gb, fenceOf(gb), "b"); err != nil {
		t.Fatalf("B's write after A's proven one: %v", err)
	}
}

// Only a grant's owner, or an identity with the administer verb, may report a
// fence regression on it (or change its labels and annotations).
func TestOnlyTheOwnerReportsAFenceRegression(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	b, c, op := as(t, "fr2-b"), as(t, "fr2-c"), as(t, "fr2-admin")
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "administer"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"locking.lockwarden.io"}, Resources: []string{"lockgrants"}, Verbs: []string{"administer"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "administer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: "fr2-admin"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := admin.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	g := mustAcquire(t, b, ns, 60)
	annotateGrant := func(x *actor, key, value string) error {
		cur := &lockingv1alpha1.LockGrant{}
		if err := x.c.Get(t.Context(), client.ObjectKeyFromObject(g), cur); err != nil {
			return err
		}
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[key] = value
		return x.c.Update(t.Context(), cur)
	}
	wantReason(t, "another identity reporting a regression", annotateGrant(c, lockingv1alpha1.FenceRegressionAnnotation, "forged by c"), "NOT_OWNER")
	wantReason(t, "another identity labeling the grant", annotateGrant(c, "team", "c"), "NOT_OWNER")
	if cur := get(t, g); cur.Annotations[lockingv1alpha1.FenceRegressionAnnotation] != "" {
		t.Fatalf("a refused report reached the grant: %v", cur.Annotations)
	}
	if err := annotateGrant(op, "ticket", "OPS-1"); err != nil {
		t.Fatalf("an identity with the administer verb: %v", err)
	}
	if err := annotateGrant(b, lockingv1alpha1.FenceRegressionAnnotation, "the ledger refused fence 1"); err != nil {
		t.Fatalf("the owner's report: %v", err)
	}
	waitFor(t, g, "the FenceRegression condition", func(g *lockingv1alpha1.LockGrant) bool {
		for _, cond := range g.Status.Conditions {
			if cond.Type == "FenceRegression" && cond.Status == metav1.ConditionTrue {
				return strings.Contains(cond.Message, "the ledger refused fence 1")
			}
		}
		return false
	})
}

// A Shadow policy's denial note is cleared by the next accepted write, also
// after the policy moved to Enforce.
func TestShadowDenialClearedAfterEnforce(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "sd-a"), as(t, "sd-b")
	p := newPolicy(t, "shadow-then-enforce", ns, lockingv1alpha1.ModeShadow, "sd-a")
	waitUntil(t, "the Shadow webhook notes an unfenced write", func() (bool, error) {
		if err := writeCM(t, b, ns, "batch-9", "unfenced", nil, map[string]string{"app": p.Name}); err != nil {
			return false, err
		}
		return configMap(t, ns, "batch-9").Annotations[lockingv1alpha1.ShadowDenialAnnotation] != "", nil
	})
	setMode(t, p, lockingv1alpha1.ModeEnforce)
	g := policyAcquire(t, a, ns, "settlement/"+ns+"/batch-9", p.Name)
	proven := map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof}
	waitUntil(t, "Enforce admits the holder's proven write", func() (bool, error) {
		return writeCM(t, a, ns, "batch-9", "proven", proven, nil) == nil, nil
	})
	if note := configMap(t, ns, "batch-9").Annotations[lockingv1alpha1.ShadowDenialAnnotation]; note != "" {
		t.Fatalf("the accepted write under Enforce kept the shadow note %q", note)
	}
	wantReason(t, "an unfenced write under Enforce", writeCM(t, b, ns, "batch-9", "x", nil, nil), "NO_FENCE")
}

// warnings collects the API server's warnings for one client.
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, text)
}

// A guard label with any value but "true" guards nothing: the write is
// admitted with a warning saying so.
func TestGuardLabelOtherThanTrueWarns(t *testing.T) {
	ns := namespace(t)
	seen := &warnings{}
	c := rest.CopyConfig(cfg)
	c.WarningHandler = seen
	cl, err := client.New(c, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "almost", Labels: map[string]string{lockingv1alpha1.GuardedLabel: "True"}}}
	if err := cl.Create(t.Context(), cm); err != nil {
		t.Fatal(err)
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if len(seen.got) == 0 || !strings.Contains(strings.Join(seen.got, "\n"), `only the value "true"`) {
		t.Fatalf("warnings = %q, want one saying the label guards nothing", seen.got)
	}
	if got := configMap(t, ns, "almost"); got == nil {
		t.Fatal("the object was not created")
	}
}

// A cluster-scoped object cannot be guarded: it would take grants of every
// namespace, each namespace with fences of its own. Removing the label is
// allowed, so an object labeled earlier is not stuck.
func TestClusterScopedObjectsCannotBeGuarded(t *testing.T) {
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "guarded-" + namespace(t), Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true"},
		Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: resource, lockingv1alpha1.GrantAnnotation: "billing/g", lockingv1alpha1.FenceAnnotation: "1"}}}
	wantReason(t, "guarding a ClusterRole", admin.Create(t.Context(), cr), "NO_RESOURCE")
	cr.Labels = nil
	if err := admin.Create(t.Context(), cr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(t.Context(), cr) })
	cr.Labels = map[string]string{lockingv1alpha1.GuardedLabel: "true"}
	wantReason(t, "labeling a ClusterRole guarded", admin.Update(t.Context(), cr), "NO_RESOURCE")
}

// A record written while a GuardPolicy could not refuse it (Shadow mode, or
// before a selector was widened) never locks the real holder out: under a
// policy a record counts only with a proof that verifies.
func TestForgedRecordUnderShadowPolicy(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "fsp-a"), as(t, "fsp-b")
	p := newPolicy(t, "forged-under-shadow", ns, lockingv1alpha1.ModeShadow, "fsp-a")
	forged := map[string]string{lockingv1alpha1.AcceptedGrantAnnotation: ns + "/whatever", lockingv1alpha1.AcceptedFenceAnnotation: "999999"}
	waitUntil(t, "Shadow admits the forged record", func() (bool, error) {
		if err := writeCM(t, b, ns, "cm6", "forged", forged, map[string]string{"app": p.Name}); err != nil {
			return false, err
		}
		return configMap(t, ns, "cm6").Annotations[lockingv1alpha1.ShadowDenialAnnotation] != "", nil
	})
	setMode(t, p, lockingv1alpha1.ModeEnforce)
	g := policyAcquire(t, a, ns, "settlement/"+ns+"/cm6", p.Name)
	proven := map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof}
	waitUntil(t, "Enforce admits the holder despite the forged record", func() (bool, error) {
		err := writeCM(t, a, ns, "cm6", "proven", proven, nil)
		if r := reason(err); r == "STALE_OWNER" {
			t.Fatalf("the forged record locked the holder out: %v", err)
		}
		return err == nil, nil
	})
	if data, fence := readCM(t, ns, "cm6"); data != "proven" || fence != fenceOf(g) {
		t.Fatalf("object = %q at fence %s", data, fence)
	}
}

// An object both labeled guarded and covered by an Enforce policy: the
// webhook that runs first consumes the claim, the other judges the record
// it wrote in the same request; the holder's proven write is accepted and a
// write without a claim is refused.
func TestLabeledObjectUnderPolicy(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "lp-a")
	p := newPolicy(t, "labeled-and-covered", ns, lockingv1alpha1.ModeEnforce, "lp-a")
	g := policyAcquire(t, a, ns, "settlement/"+ns+"/cm9", p.Name)
	proven := map[string]string{
		lockingv1alpha1.ResourceAnnotation: "settlement/" + ns + "/cm9",
		lockingv1alpha1.GrantAnnotation:    g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}
	labels := map[string]string{"app": p.Name, lockingv1alpha1.GuardedLabel: "true"}
	waitUntil(t, "both webhooks admit the holder's proven write", func() (bool, error) {
		return writeCM(t, a, ns, "cm9", "proven", proven, labels) == nil, nil
	})
	if err := writeCM(t, a, ns, "cm9", "proven-2", proven, nil); err != nil {
		t.Fatalf("the holder's second proven write: %v", err)
	}
	wantRecorded(t, configMap(t, ns, "cm9"), ns+"/"+g.Name, fenceOf(g))
	wantReason(t, "a write without a claim", writeCM(t, a, ns, "cm9", "x", nil, nil), "NO_FENCE")
}

// Nobody but the owner adds a finalizer or an owner reference to a grant:
// either would keep the owner from deleting it or hand it to the garbage
// collector.
func TestOnlyTheOwnerChangesAGrantsFinalizers(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, c := as(t, "fin-a"), as(t, "fin-c")
	g := mustAcquire(t, a, ns, 60)
	cur := get(t, g)
	cur.Finalizers = append(cur.Finalizers, "example.com/hold")
	wantReason(t, "another identity adding a finalizer", c.c.Update(t.Context(), cur), "NOT_OWNER")
	cur = get(t, g)
	cur.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "0d4f0a8e-0000-4000-8000-000000000000"}}
	wantReason(t, "another identity adding an owner reference", c.c.Update(t.Context(), cur), "NOT_OWNER")
}

// A record planted while a Shadow policy admitted everything, naming a real
// grant (and its real proof) of the same resource ID in another namespace,
// neither locks the holder out nor lets its planter delete the object:
// fences of another namespace are another resource's.
func TestRecordFromAnotherNamespace(t *testing.T) {
	ns, ns2, tl := namespace(t), namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "xns-a"), as(t, "xns-b")
	p := newPolicy(t, "other-namespace-record", ns, lockingv1alpha1.ModeShadow, "xns-a")
	res := "settlement/" + ns + "/cm-x"
	var foreign *lockingv1alpha1.LockGrant
	for range 5 { // push the other namespace's fence above the holder's
		g, err := acquire(t, b, ns2, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource = res })
		if err != nil {
			t.Fatal(err)
		}
		foreign = waitPhase(t, g, lockingv1alpha1.PhaseHeld)
		if err := release(t, b, foreign); err != nil {
			t.Fatal(err)
		}
	}
	planted := map[string]string{
		lockingv1alpha1.AcceptedGrantAnnotation: ns2 + "/" + foreign.Name, lockingv1alpha1.AcceptedFenceAnnotation: fenceOf(foreign),
		lockingv1alpha1.AcceptedProofAnnotation: foreign.Status.Proof, lockingv1alpha1.AcceptedIntentAnnotation: fencing.IntentDelete,
	}
	waitUntil(t, "Shadow admits the planted record", func() (bool, error) {
		if err := writeCM(t, b, ns, "cm-x", "planted", planted, map[string]string{"app": p.Name}); err != nil {
			return false, err
		}
		return configMap(t, ns, "cm-x").Annotations[lockingv1alpha1.ShadowDenialAnnotation] != "", nil
	})
	setMode(t, p, lockingv1alpha1.ModeEnforce)
	g := policyAcquire(t, a, ns, res, p.Name)
	waitUntil(t, "Enforce refuses a write without a claim", func() (bool, error) {
		return reason(writeCM(t, b, ns, "cm-x", "x", nil, nil)) == "NO_FENCE", nil
	})
	rv := configMap(t, ns, "cm-x").ResourceVersion
	if err := deleteAt(t, b, ns, "cm-x", rv); err == nil {
		t.Fatal("the planter deleted the object under a record of another namespace")
	}
	proven := map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof}
	if err := writeCM(t, a, ns, "cm-x", "proven", proven, nil); err != nil {
		t.Fatalf("the holder was locked out by another namespace's record: %v", err)
	}
}

// A replica sharing the holder's identity that sends back a record it read
// earlier (a re-read and update, no claim) is refused: only a claim set by
// the request authorizes it.
func TestResentRecordIsNoClaim(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "rr-a")
	g := mustAcquire(t, a, ns, 60)
	if err := write(t, a, ns, "cm-r", g, fenceOf(g), "first"); err != nil {
		t.Fatal(err)
	}
	old := configMap(t, ns, "cm-r")
	if err := writeCM(t, a, ns, "cm-r", "second", map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.WriteIDAnnotation: "w2"}, nil); err != nil {
		t.Fatal(err)
	}
	stale := old.DeepCopy()
	stale.ResourceVersion = ""
	stale.Data = map[string]string{"result": "stale"}
	stale.Annotations[lockingv1alpha1.AcceptedWriteIDAnnotation] = "w1"
	wantReason(t, "replacing with an older record", a.c.Update(t.Context(), stale), "NO_FENCE")
	intent := configMap(t, ns, "cm-r")
	intent.Annotations[lockingv1alpha1.AcceptedIntentAnnotation] = fencing.IntentDelete
	wantReason(t, "planting a delete intent without a claim", a.c.Update(t.Context(), intent), "NO_FENCE")
}

// A Namespace object is cluster-scoped: it cannot be guarded.
func TestNamespaceObjectCannotBeGuarded(t *testing.T) {
	ns := namespace(t)
	cur := &corev1.Namespace{}
	if err := admin.Get(t.Context(), client.ObjectKey{Name: ns}, cur); err != nil {
		t.Fatal(err)
	}
	cur.Labels[lockingv1alpha1.GuardedLabel] = "true"
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[lockingv1alpha1.ResourceAnnotation] = resource
	cur.Annotations[lockingv1alpha1.GrantAnnotation] = "g"
	cur.Annotations[lockingv1alpha1.FenceAnnotation] = "1"
	wantReason(t, "guarding a Namespace", admin.Update(t.Context(), cur), "NO_RESOURCE")
}

// An object covered by two Enforce policies is refused with a reason that
// says so, by either webhook.
func TestTwoEnforcePoliciesOnOneObject(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "two-a")
	p1 := newPolicy(t, "two-first", ns, lockingv1alpha1.ModeEnforce, "two-a")
	p2 := newPolicy(t, "two-second", ns, lockingv1alpha1.ModeEnforce, "two-a")
	for _, p := range []*lockingv1alpha1.GuardPolicy{p1, p2} {
		cur := &lockingv1alpha1.GuardPolicy{}
		if err := admin.Get(t.Context(), client.ObjectKeyFromObject(p), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "two"}}
		if err := admin.Update(t.Context(), cur); err != nil {
			t.Fatal(err)
		}
		waitPolicyReady(t, cur)
	}
	g := policyAcquire(t, a, ns, "settlement/"+ns+"/cm-2", p1.Name)
	proven := map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof}
	waitUntil(t, "the write is refused for its two policies", func() (bool, error) {
		err := writeCM(t, a, ns, "cm-2", "x", proven, map[string]string{"app": "two"})
		return err != nil && strings.Contains(err.Error(), "takes one policy"), nil
	})
}
