// Package guardpolicy is the GuardPolicy controller. From all policies it
// writes two admission webhook configurations: a validating one with one
// webhook per Enforce policy (failurePolicy Fail) and a mutating one with
// one webhook per Shadow policy (failurePolicy Ignore: a Shadow policy only
// records). Each webhook selects the policy's resources, namespaces and
// labels, and calls the manager at /guardpolicy/{enforce,shadow}/<name>,
// reached the same way (Service or URL, same CA) as the static guarded-write
// webhook it copies from, and skipping the namespaces that one skips
// (kube-system and the manager's own), so that a policy never holds up a
// write there while no replica answers. It reports each policy's Ready
// condition.
//
// Both configurations are created at run time, so no installer knows them:
// each carries the labels in OwnedLabels, by which `make undeploy` and the
// Helm chart's uninstall find and delete them, and an owner reference to the
// static configuration (TemplateConfig), so that on a cluster with the
// garbage collector they go when it goes. Left behind, an Enforce webhook
// (failurePolicy Fail) would refuse every write to the objects it selects.
//
// Revoking grants that a changed policy no longer allows is the LockGrant
// controller's job; this one only installs admission.
package guardpolicy

import (
	"context"
	"fmt"
	"net/url"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Names of the webhook configurations this controller owns. Enforce
// policies have a mutating webhook (creates and updates) and a validating
// one (deletes), both in configurations named EnforceConfigName.
const (
	EnforceConfigName = "lockwarden-guardpolicies"
	ShadowConfigName  = "lockwarden-guardpolicies-shadow"
	// TemplateWebhookName is the static guarded-write webhook whose
	// clientConfig the policy webhooks copy.
	TemplateWebhookName = "guard.locking.lockwarden.io"
)

// OwnedLabels mark the configurations this controller creates, for
// uninstallers: select them with ManagedBySelector.
var OwnedLabels = map[string]string{
	"app.kubernetes.io/part-of":    "lockwarden",
	"app.kubernetes.io/managed-by": "lockwarden-manager",
}

// ManagedBySelector selects what the manager created at run time.
const ManagedBySelector = "app.kubernetes.io/managed-by=lockwarden-manager"

// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=guardpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=guardpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=get;list;watch;create;update;patch

// Reconciler installs the policies' webhooks.
type Reconciler struct {
	Client client.Client
	// APIReader reads the configurations this controller owns directly,
	// so that a lagging cache never makes it create one twice.
	APIReader client.Reader
	// TemplateConfig is the ValidatingWebhookConfiguration holding the
	// static guarded-write webhook.
	TemplateConfig string
}

// all is the single reconcile request: every pass rebuilds both
// configurations from every policy.
var all = reconcile.Request{NamespacedName: types.NamespacedName{Name: "all"}}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	toAll := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{all}
	})
	named := func(names ...string) predicate.Predicate {
		return predicate.NewPredicateFuncs(func(o client.Object) bool { return slices.Contains(names, o.GetName()) })
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("guardpolicy").
		Watches(&lockingv1alpha1.GuardPolicy{}, toAll, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&admissionregistrationv1.ValidatingWebhookConfiguration{}, toAll, builder.WithPredicates(named(r.TemplateConfig, EnforceConfigName))).
		Watches(&admissionregistrationv1.MutatingWebhookConfiguration{}, toAll, builder.WithPredicates(named(EnforceConfigName, ShadowConfigName))).
		Complete(r)
}

// Reconcile writes both configurations and every policy's status.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var list lockingv1alpha1.GuardPolicyList
	if err := r.Client.List(ctx, &list); err != nil {
		return reconcile.Result{}, err
	}
	slices.SortFunc(list.Items, func(a, b lockingv1alpha1.GuardPolicy) int { return compare(a.Name, b.Name) })
	template, exempt, owner, err := r.template(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var enforce []admissionregistrationv1.ValidatingWebhook
	var shadow, enforceWrites []admissionregistrationv1.MutatingWebhook
	invalid := map[string]error{}
	for i := range list.Items {
		p := &list.Items[i]
		if err := policy.Validate(p); err != nil {
			// One broken policy must not break the configuration shared
			// with every other; it gets no webhook and says why.
			invalid[p.Name] = err
			continue
		}
		if p.Spec.Mode == lockingv1alpha1.ModeEnforce {
			cc := withPath(template, lockingv1alpha1.GuardPolicyEnforcePathPrefix+p.Name)
			enforce = append(enforce, validating(p, cc, exempt))
			enforceWrites = append(enforceWrites, mutating(p, cc, exempt, admissionregistrationv1.Fail, writeOps...))
		} else {
			shadow = append(shadow, mutating(p, withPath(template, lockingv1alpha1.GuardPolicyShadowPathPrefix+p.Name), exempt, admissionregistrationv1.Ignore, append(writeOps, admissionregistrationv1.Delete)...))
		}
	}
	if err := r.writeValidating(ctx, owner, enforce); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.writeMutating(ctx, owner, EnforceConfigName, enforceWrites); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.writeMutating(ctx, owner, ShadowConfigName, shadow); err != nil {
		return reconcile.Result{}, err
	}
	for i := range list.Items {
		if err := r.setReady(ctx, &list.Items[i], invalid[list.Items[i].Name]); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// template returns the static guarded-write webhook's clientConfig and
// namespaceSelector (the namespaces no guarded-write webhook enters; nil
// when it has none), and an owner reference to its configuration.
func (r *Reconciler) template(ctx context.Context) (admissionregistrationv1.WebhookClientConfig, *metav1.LabelSelector, metav1.OwnerReference, error) {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := r.Client.Get(ctx, types.NamespacedName{Name: r.TemplateConfig}, cfg); err != nil {
		return admissionregistrationv1.WebhookClientConfig{}, nil, metav1.OwnerReference{}, fmt.Errorf("reading %s: %w", r.TemplateConfig, err)
	}
	owner := metav1.OwnerReference{
		APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingWebhookConfiguration",
		Name: cfg.Name, UID: cfg.UID,
	}
	for _, w := range cfg.Webhooks {
		if w.Name == TemplateWebhookName {
			return w.ClientConfig, w.NamespaceSelector, owner, nil
		}
	}
	return admissionregistrationv1.WebhookClientConfig{}, nil, owner, fmt.Errorf("%s has no webhook %s", r.TemplateConfig, TemplateWebhookName)
}

// owned returns obj's metadata with OwnedLabels and owner set, and whether
// that changed anything.
func owned(m *metav1.ObjectMeta, owner metav1.OwnerReference) bool {
	changed := false
	for k, v := range OwnedLabels {
		if m.Labels[k] != v {
			if m.Labels == nil {
				m.Labels = map[string]string{}
			}
			m.Labels[k] = v
			changed = true
		}
	}
	if refs := []metav1.OwnerReference{owner}; !equality.Semantic.DeepEqual(m.OwnerReferences, refs) {
		m.OwnerReferences = refs
		changed = true
	}
	return changed
}

// withPath points a copy of the client config at path.
func withPath(c admissionregistrationv1.WebhookClientConfig, path string) admissionregistrationv1.WebhookClientConfig {
	out := *c.DeepCopy()
	switch {
	case out.Service != nil:
		out.Service.Path = ptr.To(path)
	case out.URL != nil:
		if u, err := url.Parse(*out.URL); err == nil {
			u.Path = path
			out.URL = ptr.To(u.String())
		}
	}
	return out
}

// writeOps are the operations the mutating webhooks check and consume
// claims on; deletes are judged by the validating one.
var writeOps = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}

// rules selects the policy's resources and every subresource of them (status
// writes carry the object, so they are checked like the object; scale,
// eviction and binding reach the policy's webhook only when its selector
// selects everything, and are left to the static subresource webhook
// otherwise) for ops.
func rules(p *lockingv1alpha1.GuardPolicy, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
	var out []admissionregistrationv1.RuleWithOperations
	for _, r := range p.Spec.Resources {
		out = append(out, admissionregistrationv1.RuleWithOperations{
			Operations: slices.Clone(ops),
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{r.APIGroup}, APIVersions: []string{"*"}, Resources: []string{r.Resource, r.Resource + "/*"},
				Scope: ptr.To(admissionregistrationv1.AllScopes),
			},
		})
	}
	return out
}

// namespaceSelector selects the policy's namespaces (every one when it
// names none) that the template's selector, exempt, also selects: both
// selectors' requirements hold.
func namespaceSelector(p *lockingv1alpha1.GuardPolicy, exempt *metav1.LabelSelector) *metav1.LabelSelector {
	out := &metav1.LabelSelector{}
	if exempt != nil {
		out = exempt.DeepCopy()
	}
	if len(p.Spec.Namespaces) > 0 {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: slices.Clone(p.Spec.Namespaces),
		})
	}
	return out
}

func objectSelector(p *lockingv1alpha1.GuardPolicy) *metav1.LabelSelector {
	if p.Spec.Selector == nil {
		return &metav1.LabelSelector{}
	}
	return p.Spec.Selector.DeepCopy()
}

func webhookName(p *lockingv1alpha1.GuardPolicy) string {
	return p.Name + ".guardpolicy.locking.lockwarden.io"
}

// webhookTimeoutSeconds bounds what a frozen manager replica costs a
// guarded write, as in config/webhook/manifests.yaml (docs/ha.md).
const webhookTimeoutSeconds int32 = 1

func validating(p *lockingv1alpha1.GuardPolicy, cc admissionregistrationv1.WebhookClientConfig, exempt *metav1.LabelSelector) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name: webhookName(p), ClientConfig: cc, Rules: rules(p, admissionregistrationv1.Delete),
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       namespaceSelector(p, exempt),
		ObjectSelector:          objectSelector(p),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To(webhookTimeoutSeconds),
		AdmissionReviewVersions: []string{"v1"},
	}
}

// mutating is a policy's webhook for the operations ops: Enforce fails closed
// (failure Fail); Shadow must never block a write, not even when the manager
// is down (Ignore). Never reinvoked: a claim is consumed once.
func mutating(p *lockingv1alpha1.GuardPolicy, cc admissionregistrationv1.WebhookClientConfig, exempt *metav1.LabelSelector, failure admissionregistrationv1.FailurePolicyType, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name: webhookName(p), ClientConfig: cc, Rules: rules(p, ops...),
		FailurePolicy:           ptr.To(failure),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       namespaceSelector(p, exempt),
		ObjectSelector:          objectSelector(p),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun),
		TimeoutSeconds:          ptr.To(webhookTimeoutSeconds),
		AdmissionReviewVersions: []string{"v1"},
		ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
	}
}

func (r *Reconciler) writeValidating(ctx context.Context, owner metav1.OwnerReference, hooks []admissionregistrationv1.ValidatingWebhook) error {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Name: EnforceConfigName}, cfg)
	if apierrors.IsNotFound(err) {
		cfg = &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: EnforceConfigName}, Webhooks: hooks}
		owned(&cfg.ObjectMeta, owner)
		return r.Client.Create(ctx, cfg)
	}
	if err != nil {
		return err
	}
	if !owned(&cfg.ObjectMeta, owner) && equality.Semantic.DeepEqual(cfg.Webhooks, hooks) {
		return nil
	}
	cfg.Webhooks = hooks
	return r.Client.Update(ctx, cfg)
}

func (r *Reconciler) writeMutating(ctx context.Context, owner metav1.OwnerReference, name string, hooks []admissionregistrationv1.MutatingWebhook) error {
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Name: name}, cfg)
	if apierrors.IsNotFound(err) {
		cfg = &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: hooks}
		owned(&cfg.ObjectMeta, owner)
		return r.Client.Create(ctx, cfg)
	}
	if err != nil {
		return err
	}
	if !owned(&cfg.ObjectMeta, owner) && equality.Semantic.DeepEqual(cfg.Webhooks, hooks) {
		return nil
	}
	cfg.Webhooks = hooks
	return r.Client.Update(ctx, cfg)
}

func (r *Reconciler) setReady(ctx context.Context, p *lockingv1alpha1.GuardPolicy, invalid error) error {
	before := p.Status.DeepCopy()
	p.Status.ObservedGeneration = p.Generation
	cond := metav1.Condition{
		Type: lockingv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: lockingv1alpha1.GuardPolicyReasonWebhookInstalled, ObservedGeneration: p.Generation,
		Message: fmt.Sprintf("%s webhook %s installed", p.Spec.Mode, webhookName(p)),
	}
	if invalid != nil {
		cond.Status, cond.Reason = metav1.ConditionFalse, lockingv1alpha1.GuardPolicyReasonInvalidPolicy
		cond.Message = string(fencing.ReasonInvalidPolicy) + ": not installed: " + invalid.Error()
	}
	meta.SetStatusCondition(&p.Status.Conditions, cond)
	if equality.Semantic.DeepEqual(before, &p.Status) {
		return nil
	}
	return r.Client.Status().Update(ctx, p)
}
