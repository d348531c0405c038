package install

import (
	"context"
	"maps"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/guardpolicy"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

const (
	billing      = "billing"
	storyLease   = 2 // seconds: A's lease, which it stops renewing
	resultObject = "invoice-result"
	policyName   = "settlements"
	settlementCM = "settlement-1"
)

func (c *cluster) ensureNamespace(name string) {
	c.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.admin.Create(c.t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
}

// playPausedHolder plays the README's story against the installation:
// worker A takes a short lease, writes, and stalls past its lease; B
// acquires with a higher fence and writes; A's late write is refused with
// STALE_OWNER and the object keeps B's data. It returns B's fence.
func (c *cluster) playPausedHolder(a, b client.WithWatch, resource string) int64 {
	c.t.Helper()
	ctx := c.t.Context()
	c.ensureNamespace(billing)

	// A: a grant it will never renew, as a frozen process.
	ga := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "worker-a-", Namespace: billing},
		Spec:       lockingv1alpha1.LockGrantSpec{Resource: resource, LeaseDurationSeconds: storyLease},
	}
	if err := a.Create(ctx, ga); err != nil {
		c.t.Fatalf("A requests %s: %v", resource, err)
	}
	c.waitGrant(ga, lockingv1alpha1.PhaseHeld)
	aAnn := map[string]string{
		lockingv1alpha1.ResourceAnnotation: resource,
		lockingv1alpha1.GrantAnnotation:    billing + "/" + ga.Name,
		lockingv1alpha1.FenceAnnotation:    formatFence(ga.Status.FenceToken),
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: billing, Name: resultObject,
		Labels:      map[string]string{lockingv1alpha1.GuardedLabel: "true"},
		Annotations: maps.Clone(aAnn),
	}, Data: map[string]string{"result": "A: first half"}}
	if err := a.Create(ctx, cm); err != nil {
		if apierrors.IsAlreadyExists(err) {
			c.t.Fatalf("%s/%s exists already", billing, resultObject)
		}
		c.t.Fatalf("A's write with fence %d was refused: %v", ga.Status.FenceToken, err)
	}
	// A stalls; its lease runs out on the controller's clock.
	c.waitGrant(ga, lockingv1alpha1.PhaseExpired)

	h, err := lock.NewClient(b, lock.WithNamespace(billing)).Acquire(ctx, resource, lock.WithTTL(30*time.Second), lock.WithWait(time.Minute))
	if err != nil {
		c.t.Fatalf("B acquires %s: %v", resource, err)
	}
	defer func() { _ = h.Release(context.WithoutCancel(ctx)) }()
	if h.Info().Fence <= ga.Status.FenceToken {
		c.t.Fatalf("B's fence %d is not above A's %d", h.Info().Fence, ga.Status.FenceToken)
	}
	if err := b.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
		c.t.Fatal(err)
	}
	if err := h.Stamp(cm); err != nil {
		c.t.Fatal(err)
	}
	cm.Data["result"] = "B: correct total"
	if err := b.Update(ctx, cm); err != nil {
		c.t.Fatalf("B's write with fence %d was refused: %v", h.Info().Fence, err)
	}

	// A wakes and writes what it computed before the pause.
	if err := a.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
		c.t.Fatal(err)
	}
	maps.Copy(cm.Annotations, aAnn)
	delete(cm.Annotations, lockingv1alpha1.ProofAnnotation)
	cm.Data["result"] = "A: stale total"
	err = a.Update(ctx, cm)
	if err == nil || !strings.Contains(err.Error(), "STALE_OWNER") {
		c.t.Fatalf("A's late write with fence %d: %v, want a STALE_OWNER refusal", ga.Status.FenceToken, err)
	}
	if err := c.admin.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
		c.t.Fatal(err)
	}
	if cm.Data["result"] != "B: correct total" {
		c.t.Fatalf("the object holds %q, want B's result", cm.Data["result"])
	}
	c.t.Logf("story: A fence %d, B fence %d, A's late write refused: %v", ga.Status.FenceToken, h.Info().Fence, err)
	return h.Info().Fence
}

// acquireOnce takes and releases resource as cl and returns its fence.
func (c *cluster) acquireOnce(cl client.WithWatch, resource string) int64 {
	c.t.Helper()
	ctx := c.t.Context()
	h, err := lock.NewClient(cl, lock.WithNamespace(billing)).Acquire(ctx, resource, lock.WithTTL(30*time.Second), lock.WithWait(time.Minute))
	if err != nil {
		c.t.Fatalf("acquiring %s: %v", resource, err)
	}
	if err := h.Release(ctx); err != nil {
		c.t.Fatal(err)
	}
	return h.Info().Fence
}

func (c *cluster) waitGrant(g *lockingv1alpha1.LockGrant, phase lockingv1alpha1.LockGrantPhase) {
	c.t.Helper()
	err := wait.PollUntilContextTimeout(c.t.Context(), pollInterval, waitLimit, true, func(ctx context.Context) (bool, error) {
		if err := c.admin.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
			return false, err
		}
		return g.Status.Phase == phase, nil
	})
	if err != nil {
		c.t.Fatalf("grant %s/%s is %s, want %s: %v", g.Namespace, g.Name, g.Status.Phase, phase, err)
	}
}

// enforcePolicy creates an Enforce GuardPolicy over ConfigMaps labeled
// app=settlement in billing (one such ConfigMap exists), waits for the
// manager's runtime webhook configuration, checks it is labeled and owned
// by the installed static configuration, and that it enforces.
func (c *cluster) enforcePolicy() {
	c.t.Helper()
	ctx := c.t.Context()
	c.ensureNamespace(billing)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: billing, Name: settlementCM, Labels: map[string]string{"app": "settlement"}}}
	if err := c.admin.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	p := &lockingv1alpha1.GuardPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policyName},
		Spec: lockingv1alpha1.GuardPolicySpec{
			Resources:  []lockingv1alpha1.GuardedResource{{Resource: "configmaps"}},
			Namespaces: []string{billing},
			Selector:   &metav1.LabelSelector{MatchLabels: map[string]string{"app": "settlement"}},
			Holders:    []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: billing, Name: "settlement-7"}},
			Mode:       lockingv1alpha1.ModeEnforce,
		},
	}
	if err := c.admin.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	c.waitRuntimeWebhook()
	// Enforced: an unfenced write is refused (polling: the API server
	// picks up a new webhook configuration within a moment).
	err := wait.PollUntilContextTimeout(ctx, pollInterval, waitLimit, true, func(ctx context.Context) (bool, error) {
		if err := c.admin.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
			return false, err
		}
		cm.Data = map[string]string{"total": "unfenced"}
		return c.admin.Update(ctx, cm) != nil, nil
	})
	if err != nil {
		c.t.Fatalf("the Enforce GuardPolicy does not refuse an unfenced write")
	}
}

// waitRuntimeWebhook waits for the Enforce policy's webhook configuration
// and checks its labels and owner.
func (c *cluster) waitRuntimeWebhook() {
	c.t.Helper()
	ctx := c.t.Context()
	var static admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.admin.Get(ctx, client.ObjectKey{Name: staticConfigs[1]}, &static); err != nil {
		c.t.Fatal(err)
	}
	var vc admissionregistrationv1.ValidatingWebhookConfiguration
	err := wait.PollUntilContextTimeout(ctx, pollInterval, waitLimit, true, func(ctx context.Context) (bool, error) {
		err := c.admin.Get(ctx, client.ObjectKey{Name: guardpolicy.EnforceConfigName}, &vc)
		return err == nil && len(vc.Webhooks) == 1 && len(vc.OwnerReferences) == 1 && vc.OwnerReferences[0].UID == static.UID, nil
	})
	if err != nil {
		c.t.Fatalf("%s: webhooks %d, owners %+v; want one webhook owned by %s (uid %s)", guardpolicy.EnforceConfigName, len(vc.Webhooks), vc.OwnerReferences, static.Name, static.UID)
	}
	if vc.Labels["app.kubernetes.io/managed-by"] != "lockwarden-manager" {
		c.t.Errorf("%s has labels %v, want app.kubernetes.io/managed-by=lockwarden-manager", vc.Name, vc.Labels)
	}
}

// checkWritable: nothing lockwarden installed blocks writes any more: the
// ConfigMap the policy selected can be updated and deleted, and the
// namespace controller's deletecollection of ConfigMaps succeeds.
func (c *cluster) checkWritable() {
	c.t.Helper()
	ctx := c.t.Context()
	var vcs admissionregistrationv1.ValidatingWebhookConfigurationList
	var mcs admissionregistrationv1.MutatingWebhookConfigurationList
	if err := c.admin.List(ctx, &vcs); err != nil {
		c.t.Fatal(err)
	}
	if err := c.admin.List(ctx, &mcs); err != nil {
		c.t.Fatal(err)
	}
	for _, v := range vcs.Items {
		c.t.Errorf("ValidatingWebhookConfiguration %s is left behind", v.Name)
	}
	for _, m := range mcs.Items {
		c.t.Errorf("MutatingWebhookConfiguration %s is left behind", m.Name)
	}
	cm := &corev1.ConfigMap{}
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: billing, Name: settlementCM}, cm); err != nil {
		c.t.Fatal(err)
	}
	cm.Data = map[string]string{"total": "after uninstall"}
	if err := c.admin.Update(ctx, cm); err != nil {
		c.t.Errorf("updating the policy's ConfigMap after uninstall: %v", err)
	}
	if err := c.cs.CoreV1().ConfigMaps(billing).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		c.t.Errorf("deletecollection of ConfigMaps in %s after uninstall: %v", billing, err)
	}
}

// fenceState is what must survive an uninstall.
type fenceState struct {
	counters  map[string]int64
	issuerUID string
}

func (c *cluster) fenceState() fenceState {
	c.t.Helper()
	ctx := c.t.Context()
	var list lockingv1alpha1.FenceCounterList
	if err := c.admin.List(ctx, &list); err != nil {
		c.t.Fatalf("listing FenceCounters: %v", err)
	}
	s := fenceState{counters: map[string]int64{}}
	for _, fc := range list.Items {
		s.counters[fc.Namespace+"/"+fc.Spec.Resource] = fc.Spec.Fence
	}
	var fi lockingv1alpha1.FenceIssuer
	if err := c.admin.Get(ctx, client.ObjectKey{Name: "default"}, &fi); err != nil {
		c.t.Fatalf("reading the FenceIssuer: %v", err)
	}
	s.issuerUID = string(fi.UID)
	return s
}

func (c *cluster) checkFencesKept(before fenceState) {
	c.t.Helper()
	after := c.fenceState()
	if after.issuerUID != before.issuerUID {
		c.t.Errorf("the FenceIssuer was recreated (uid %s, was %s)", after.issuerUID, before.issuerUID)
	}
	if len(before.counters) == 0 {
		c.t.Fatal("no FenceCounters before the uninstall")
	}
	for k, f := range before.counters {
		if after.counters[k] != f {
			c.t.Errorf("FenceCounter %s: fence %d, was %d", k, after.counters[k], f)
		}
	}
}

func formatFence(f int64) string {
	return strconvFormat(f)
}

// checkRuntimeWebhookOrphaned: after `helm uninstall` the static
// configuration is gone, so the manager's runtime configuration names a
// missing owner, which a cluster's garbage collector deletes.
func (c *cluster) checkRuntimeWebhookOrphaned() {
	c.t.Helper()
	ctx := c.t.Context()
	var vc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.admin.Get(ctx, client.ObjectKey{Name: guardpolicy.EnforceConfigName}, &vc); err != nil {
		c.t.Fatal(err)
	}
	var static admissionregistrationv1.ValidatingWebhookConfiguration
	err := c.admin.Get(ctx, client.ObjectKey{Name: staticConfigs[1]}, &static)
	if !apierrors.IsNotFound(err) {
		c.t.Fatalf("%s after uninstall: %v", staticConfigs[1], err)
	}
	if len(vc.OwnerReferences) != 1 || vc.OwnerReferences[0].Name != staticConfigs[1] {
		c.t.Fatalf("%s has owners %+v, want %s", vc.Name, vc.OwnerReferences, staticConfigs[1])
	}
}

// stubCRDs stand for cert-manager's and the Prometheus Operator's CRDs.
const stubCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: issuers.cert-manager.io}
spec:
  group: cert-manager.io
  names: {kind: Issuer, plural: issuers}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  names: {kind: Certificate, plural: certificates}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, plural: servicemonitors}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: prometheusrules.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: PrometheusRule, plural: prometheusrules}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
`
