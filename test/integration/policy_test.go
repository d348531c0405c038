package integration

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// newPolicy creates a GuardPolicy over ConfigMaps labeled app=<name> in ns,
// mapping each to the resource "settlement/<namespace>/<name>", held by
// service accounts billing:<holders>.
func newPolicy(t *testing.T, name, ns string, mode lockingv1alpha1.GuardPolicyMode, holders ...string) *lockingv1alpha1.GuardPolicy {
	t.Helper()
	p := &lockingv1alpha1.GuardPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: lockingv1alpha1.GuardPolicySpec{
			Resources:          []lockingv1alpha1.GuardedResource{{Resource: "configmaps"}},
			Namespaces:         []string{ns},
			Selector:           &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			ResourceIDTemplate: "settlement/{namespace}/{name}",
			Mode:               mode,
		},
	}
	for _, h := range holders {
		p.Spec.Holders = append(p.Spec.Holders, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: h})
	}
	if err := admin.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(t.Context(), p) })
	waitPolicyReady(t, p)
	return p
}

func waitPolicyReady(t *testing.T, p *lockingv1alpha1.GuardPolicy) {
	t.Helper()
	waitUntil(t, "GuardPolicy "+p.Name+" is installed", func() (bool, error) {
		cur := &lockingv1alpha1.GuardPolicy{}
		if err := admin.Get(t.Context(), client.ObjectKeyFromObject(p), cur); err != nil {
			return false, err
		}
		return cur.Status.ObservedGeneration == cur.Generation && cur.Generation > 0, nil
	})
}

func setMode(t *testing.T, p *lockingv1alpha1.GuardPolicy, mode lockingv1alpha1.GuardPolicyMode) {
	t.Helper()
	cur := &lockingv1alpha1.GuardPolicy{}
	if err := admin.Get(t.Context(), client.ObjectKeyFromObject(p), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Mode = mode
	if err := admin.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	waitPolicyReady(t, cur)
}

func policyAcquire(t *testing.T, a *actor, ns, res, policy string) *lockingv1alpha1.LockGrant {
	t.Helper()
	g, err := acquire(t, a, ns, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource, g.Spec.Policy = res, policy })
	if err != nil {
		t.Fatalf("%s acquiring under %s: %v", a.name, policy, err)
	}
	return waitPhase(t, g, lockingv1alpha1.PhaseHeld)
}

// unfenced is a write to a policy-covered object that carries no grant.
func unfenced(t *testing.T, a *actor, ns, name, data string) error {
	return writeCM(t, a, ns, name, data, nil, map[string]string{"app": "settlements"})
}

// Shadow admits a write Enforce would deny and records it (annotation,
// Event, metric); Enforce denies the same write; a write with a proof issued
// under the policy is admitted in both.
func TestGuardPolicyShadowThenEnforce(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a, b := as(t, "gp-a"), as(t, "gp-b")
	p := newPolicy(t, "settlements", ns, lockingv1alpha1.ModeShadow, "gp-a")

	// Shadow: the webhook may take a moment to be called; poll for the record.
	waitUntil(t, "Shadow mode records the unfenced write", func() (bool, error) {
		if err := unfenced(t, b, ns, "batch-1", "unfenced"); err != nil {
			t.Fatalf("Shadow mode refused a write: %v", err)
		}
		cm := configMap(t, ns, "batch-1")
		return strings.HasPrefix(cm.Annotations[lockingv1alpha1.ShadowDenialAnnotation], "NO_FENCE"), nil
	})
	if data, _ := readCM(t, ns, "batch-1"); data != "unfenced" {
		t.Fatalf("Shadow mode did not admit the write: data %q", data)
	}
	waitUntil(t, "a ShadowDenied Event", func() (bool, error) {
		var evs eventsv1.EventList
		if err := admin.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == lockingv1alpha1.GuardPolicyReasonShadowDenied && e.Regarding.Name == "batch-1" {
				return true, nil
			}
		}
		return false, nil
	})
	if n := metricValue(t, "lockwarden_guardpolicy_shadow_denials_total", map[string]string{"policy": "settlements", "reason": "NO_FENCE"}); n < 1 {
		t.Fatalf("shadow denials metric = %v, want at least 1", n)
	}

	// A holder's proven write is admitted and clears the shadow record.
	res := "settlement/" + ns + "/batch-1"
	g := policyAcquire(t, a, ns, res, p.Name)
	if g.Status.Record.Policy != p.Name || g.Status.Record.PolicyGeneration < 1 {
		t.Fatalf("record = %+v, want it bound to the policy", g.Status.Record)
	}
	proven := map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}
	if err := writeCM(t, a, ns, "batch-1", "proven", proven, map[string]string{"app": "settlements"}); err != nil {
		t.Fatal(err)
	}
	if cm := configMap(t, ns, "batch-1"); cm.Annotations[lockingv1alpha1.ShadowDenialAnnotation] != "" {
		t.Fatalf("an admissible write kept the shadow record %q", cm.Annotations[lockingv1alpha1.ShadowDenialAnnotation])
	}

	// Enforce: the same unfenced write is denied.
	setMode(t, p, lockingv1alpha1.ModeEnforce)
	waitUntil(t, "Enforce mode denies the unfenced write", func() (bool, error) {
		return reason(writeCM(t, b, ns, "batch-1", "unfenced", map[string]string{lockingv1alpha1.GrantAnnotation: "", lockingv1alpha1.FenceAnnotation: "", lockingv1alpha1.ProofAnnotation: ""}, nil)) == "NO_FENCE", nil
	})
	wantReason(t, "B using A's proof", writeCM(t, b, ns, "batch-1", "stolen", proven, nil), "NOT_OWNER")
	if err := writeCM(t, a, ns, "batch-1", "proven-2", proven, nil); err != nil {
		t.Fatalf("the holder's proven write under Enforce: %v", err)
	}
	if data, fence := readCM(t, ns, "batch-1"); data != "proven-2" || fence != fenceOf(g) {
		t.Fatalf("object = %q at fence %s", data, fence)
	}
	// A write without the proof is refused under a policy, even with a
	// valid grant and fence.
	noProof := map[string]string{lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: ""}
	wantReason(t, "grant and fence without the proof", writeCM(t, a, ns, "batch-1", "x", noProof, nil), "NO_FENCE")
	// Requests by identities the policy does not list are refused.
	_, err := acquire(t, b, ns, 60, func(g *lockingv1alpha1.LockGrant) { g.Spec.Resource, g.Spec.Policy = res, p.Name })
	wantReason(t, "a grant request by a non-holder", err, "NOT_OWNER")
}

// Tightening a policy revokes the Held grants it no longer allows; their
// writes are refused and the object's fence does not move.
func TestGuardPolicyTightenedWhileHeld(t *testing.T) {
	ns, tl := namespace(t), startTimeline()
	tl.at(0)
	a := as(t, "gpt-a")
	p := newPolicy(t, "payouts", ns, lockingv1alpha1.ModeEnforce, "gpt-a")
	res := "settlement/" + ns + "/payout-1"
	g := policyAcquire(t, a, ns, res, p.Name)
	proven := map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}
	waitUntil(t, "the policy webhook admits the holder", func() (bool, error) {
		return writeCM(t, a, ns, "payout-1", "first", proven, map[string]string{"app": "payouts"}) == nil, nil
	})

	cur := &lockingv1alpha1.GuardPolicy{}
	if err := admin.Get(t.Context(), types.NamespacedName{Name: p.Name}, cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Holders = []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "someone-else"}}
	if err := admin.Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	g = waitPhase(t, g, lockingv1alpha1.PhaseRevoked)
	if c := metaCond(g, lockingv1alpha1.ConditionReady); c == nil || c.Reason != lockingv1alpha1.LockGrantReasonPolicyDenied {
		t.Fatalf("Ready = %+v, want reason PolicyDenied", c)
	}
	wantReason(t, "a write with the revoked grant", writeCM(t, a, ns, "payout-1", "late", proven, nil), "REVOKED")
	if data, fence := readCM(t, ns, "payout-1"); data != "first" || fence != fenceOf(g) {
		t.Fatalf("object = %q at fence %s after the refused write", data, fence)
	}
	if c := counterIn(t, ns, res); c.Spec.Fence != g.Status.FenceToken || c.Spec.Holder != nil {
		t.Fatalf("counter = %+v, want the fence kept and the resource free", c.Spec)
	}
}

// The policy's webhooks are installed where the API server calls them, in
// the policy's namespaces (every namespace when it names none) but never in
// kube-system or the manager's own: there they would hold writes up while no
// replica answers.
func TestGuardPolicyWebhookConfiguration(t *testing.T) {
	ns := namespace(t)
	p := newPolicy(t, "exports", ns, lockingv1alpha1.ModeEnforce, "x")
	w := policyWebhook(t, p.Name)
	if *w.FailurePolicy != admissionregistrationv1.Fail || w.ClientConfig.URL == nil || !strings.HasSuffix(*w.ClientConfig.URL, "/guardpolicy/enforce/exports") || len(w.ClientConfig.CABundle) == 0 {
		t.Fatalf("webhook = %+v", w)
	}
	wantNamespaces(t, w, map[string]bool{ns: true, "kube-system": false, managerNamespace: false, "other": false})

	everywhere := &lockingv1alpha1.GuardPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "everywhere-" + ns},
		Spec: lockingv1alpha1.GuardPolicySpec{
			Resources: []lockingv1alpha1.GuardedResource{{Resource: "configmaps"}},
			Selector:  &metav1.LabelSelector{MatchLabels: map[string]string{"app": "everywhere-" + ns}},
			Holders:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: "x"}},
			Mode:      lockingv1alpha1.ModeEnforce,
		},
	}
	if err := admin.Create(t.Context(), everywhere); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), everywhere) })
	waitPolicyReady(t, everywhere)
	wantNamespaces(t, policyWebhook(t, everywhere.Name), map[string]bool{ns: true, "kube-system": false, managerNamespace: false, "other": true})
}

// policyWebhook is the validating webhook of the Enforce policy name.
func policyWebhook(t *testing.T, name string) admissionregistrationv1.ValidatingWebhook {
	t.Helper()
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := admin.Get(t.Context(), types.NamespacedName{Name: "lockwarden-guardpolicies"}, cfg); err != nil {
		t.Fatal(err)
	}
	for _, w := range cfg.Webhooks {
		if w.Name == name+".guardpolicy.locking.lockwarden.io" {
			return w
		}
	}
	t.Fatalf("no webhook for policy %s in %+v", name, cfg.Webhooks)
	return admissionregistrationv1.ValidatingWebhook{}
}

// wantNamespaces fails the test unless w's namespaceSelector selects
// exactly the namespaces of want that are true.
func wantNamespaces(t *testing.T, w admissionregistrationv1.ValidatingWebhook, want map[string]bool) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	for name, selected := range want {
		if got := sel.Matches(labels.Set{"kubernetes.io/metadata.name": name}); got != selected {
			t.Errorf("webhook %s: namespaceSelector %v selects namespace %s: %v, want %v", w.Name, sel, name, got, selected)
		}
	}
}

// An Enforce policy without a selector guards every object of its kinds in
// its namespaces, whatever their labels, so its own webhook, which fails
// closed, refuses their scale requests: they stay refused while no replica
// answers, unlike those of objects guarded by label.
func TestGuardPolicyWithoutSelectorJudgesScale(t *testing.T) {
	ns := namespace(t)
	sel := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/web"}}},
			},
		},
	}
	if err := admin.Create(t.Context(), dep); err != nil {
		t.Fatal(err)
	}
	p := &lockingv1alpha1.GuardPolicy{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "deployments-"},
		Spec: lockingv1alpha1.GuardPolicySpec{
			Resources:          []lockingv1alpha1.GuardedResource{{APIGroup: "apps", Resource: "deployments"}},
			Namespaces:         []string{ns},
			ResourceIDTemplate: "deploy/{namespace}/{name}",
			Holders:            []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "billing", Name: "a"}},
			Mode:               lockingv1alpha1.ModeEnforce,
		},
	}
	if err := admin.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), p) })
	waitPolicyReady(t, p)
	judged := map[string]string{"webhook": "enforce", "decision": "denied", "reason": "NO_FENCE", "operation": "UPDATE"}
	before := metricValue(t, "lockwarden_guarded_write_decisions_total", judged)
	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	waitUntil(t, "the policy's webhook refuses the scale", func() (bool, error) {
		err := admin.SubResource("scale").Update(t.Context(), dep, client.WithSubResourceBody(scale))
		if err == nil {
			t.Fatal("a scale of a Deployment under an Enforce GuardPolicy was admitted")
		}
		return reason(err) == "NO_FENCE" && metricValue(t, "lockwarden_guarded_write_decisions_total", judged) > before, nil
	})
}

func counterIn(t *testing.T, ns, res string) *lockingv1alpha1.FenceCounter {
	t.Helper()
	c := &lockingv1alpha1.FenceCounter{}
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(res)}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// metricValue sums a counter's samples whose labels include want.
func metricValue(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	sample:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue sample
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// A policy that could not be installed is refused at admission, so it can
// never break the webhook configuration every policy shares.
func TestInvalidGuardPolicyRefused(t *testing.T) {
	for name, mutate := range map[string]func(*lockingv1alpha1.GuardPolicy){
		"bad selector": func(p *lockingv1alpha1.GuardPolicy) {
			p.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}
		},
		"bad template":    func(p *lockingv1alpha1.GuardPolicy) { p.Spec.ResourceIDTemplate = "x/{nope}" },
		"bad holder kind": func(p *lockingv1alpha1.GuardPolicy) { p.Spec.Holders[0].Kind = "Robot" },
	} {
		p := &lockingv1alpha1.GuardPolicy{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "invalid-"},
			Spec: lockingv1alpha1.GuardPolicySpec{
				Resources: []lockingv1alpha1.GuardedResource{{Resource: "configmaps"}},
				Holders:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "u"}},
				Mode:      lockingv1alpha1.ModeEnforce,
			},
		}
		mutate(p)
		if err := admin.Create(t.Context(), p); err == nil || !strings.Contains(err.Error(), "INVALID_POLICY") {
			t.Errorf("%s: %v, want INVALID_POLICY", name, err)
		}
	}
}
