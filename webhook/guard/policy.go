package guard

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// PolicyHandler serves the webhooks the GuardPolicy controller installs per
// policy: for Enforce, a mutating one for creates and updates (check and
// consume the claim, as LabelHandler) and a validating one for deletes; for
// Shadow, a mutating one that admits everything, records what it accepted the
// same way, and notes each write Enforce would deny.
type PolicyHandler struct {
	*Checker
	// Policies reads GuardPolicies (a cache is fine: the policy's
	// generation is checked against the grant record, and revocations go
	// through the registry).
	Policies client.Reader
	// Recorder emits an Event for each write Shadow mode would deny.
	Recorder events.EventRecorder
	// Shadow selects the record-only behaviour.
	Shadow bool
}

var _ admission.Handler = &PolicyHandler{}

// Handle implements admission.Handler.
func (h *PolicyHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	prefix := lockingv1alpha1.GuardPolicyEnforcePathPrefix
	if h.Shadow {
		prefix = lockingv1alpha1.GuardPolicyShadowPathPrefix
	}
	name := strings.TrimPrefix(pathOf(ctx), prefix)
	pol := &lockingv1alpha1.GuardPolicy{}
	if err := h.Policies.Get(ctx, types.NamespacedName{Name: name}, pol); err != nil {
		if h.Shadow {
			return admission.Allowed("policy not found")
		}
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if opaque(req.SubResource) {
		return h.opaque(req, pol)
	}
	w, err := decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	covers := func(o *object) (bool, error) {
		if o == nil {
			return false, nil
		}
		return policy.Covers(pol, req.Resource.Group, req.Resource.Resource, req.Namespace, o.Labels)
	}
	oldCovered, err := covers(w.old)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	newCovered, err := covers(w.new)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !oldCovered && !newCovered {
		return admission.Allowed("")
	}
	if labeled(w.old) || labeled(w.new) {
		return admission.Allowed("") // the label webhook judges it, under this policy's rules
	}
	pols, err := enforcing(ctx, h.Policies, req, w.old, w.new)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if h.Shadow && len(pols) > 0 {
		return admission.Allowed("") // an Enforce policy decides
	}
	var rec fencing.Accepted
	decision := func() error {
		if err := policy.CheckOne(pols); err != nil {
			return err
		}
		g, err := policyGuarding(w, pol, newCovered)
		if err != nil {
			return err
		}
		rec, err = h.decide(ctx, w, g)
		return err
	}()
	mode := "enforce"
	if h.Shadow {
		mode = "shadow"
	}
	observe(mode, req, decision)
	switch {
	case h.Shadow && decision != nil:
		return h.shadow(req, w, pol, decision)
	case decision != nil || req.Operation == admissionv1.Delete:
		return respond(req, decision)
	}
	return consume(w.new, rec)
}

// opaque judges a scale, eviction or binding request. The API server matched
// the policy's objectSelector against the Scale, Eviction or Binding, which
// carries none of the object's labels, so only an Enforce policy that covers
// every object of the kind in the request's namespace, whatever its labels,
// judges it here, and refuses it: its webhook, failurePolicy Fail, then keeps
// such requests refused also while no replica answers. Every other case is
// SubresourceHandler's, which looks the object up.
func (h *PolicyHandler) opaque(req admission.Request, pol *lockingv1alpha1.GuardPolicy) admission.Response {
	if h.Shadow || pol.Spec.Mode != lockingv1alpha1.ModeEnforce {
		return admission.Allowed("")
	}
	if covered, err := policy.CoversAll(pol, req.Resource.Group, req.Resource.Resource, req.Namespace); err != nil || !covered {
		return admission.Allowed("")
	}
	_, decision := fencing.CheckGuardedRequest(fencing.GuardedRequest{
		Operation: fencing.Operation(req.Operation), Subresource: req.SubResource, Opaque: true, Caller: req.UserInfo.Username,
	})
	observe("enforce", req, decision)
	return respond(req, decision)
}

// shadow admits a write Enforce would deny, and says so in an Event, a
// metric and the object's shadow-denial annotation. A dry run gets the
// annotation in the object it is answered with, and nothing else: the
// metric and the Events count the writes that happened.
func (h *PolicyHandler) shadow(req admission.Request, w write, pol *lockingv1alpha1.GuardPolicy, decision error) admission.Response {
	reason := fencing.ReasonOf(decision)
	if reason == "" {
		return admission.Allowed("shadow mode: the check could not run: " + decision.Error())
	}
	if !dryRun(req) {
		shadowDenials.WithLabelValues(pol.Name, string(reason)).Inc()
	}
	if h.Recorder != nil && !dryRun(req) {
		regarding := &corev1.ObjectReference{
			APIVersion: req.Kind.Group + "/" + req.Kind.Version, Kind: req.Kind.Kind,
			Namespace: req.Namespace, Name: req.Name,
		}
		if req.Kind.Group == "" {
			regarding.APIVersion = req.Kind.Version
		}
		h.Recorder.Eventf(regarding, nil, corev1.EventTypeWarning, lockingv1alpha1.GuardPolicyReasonShadowDenied, string(req.Operation),
			"GuardPolicy %s (Shadow) would deny this %s: %s", pol.Name, strings.ToLower(string(req.Operation)), decision.Error())
	}
	if w.new == nil || req.SubResource != "" {
		return admission.Allowed("")
	}
	const key = lockingv1alpha1.ShadowDenialAnnotation
	if w.new.Annotations == nil {
		return admission.Patched("", jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{key: decision.Error()}))
	}
	path := "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
	return admission.Patched("", jsonpatch.NewOperation("add", path, decision.Error()))
}

type pathKey struct{}

// WithPath is the webhook's context function: it keeps the request path,
// which names the policy.
func WithPath(ctx context.Context, r *http.Request) context.Context {
	return context.WithValue(ctx, pathKey{}, r.URL.Path)
}

func pathOf(ctx context.Context) string {
	p, _ := ctx.Value(pathKey{}).(string)
	return p
}

// enforcing returns the Enforce GuardPolicies that cover the object of req,
// stored or new; nil when policies is nil.
func enforcing(ctx context.Context, policies client.Reader, req admission.Request, objs ...*object) ([]*lockingv1alpha1.GuardPolicy, error) {
	if policies == nil {
		return nil, nil
	}
	var list lockingv1alpha1.GuardPolicyList
	if err := policies.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing GuardPolicies: %w", err)
	}
	var out []*lockingv1alpha1.GuardPolicy
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.Mode != lockingv1alpha1.ModeEnforce {
			continue
		}
		for _, o := range objs {
			if o == nil {
				continue
			}
			if ok, err := policy.Covers(p, req.Resource.Group, req.Resource.Resource, req.Namespace, o.Labels); err == nil && ok {
				out = append(out, p)
				break
			}
		}
	}
	return out, nil
}
