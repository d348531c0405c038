package guard

import (
	"context"
	"net/http"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Path prefixes of the per-policy webhooks; the policy's name follows.
const (
	EnforcePathPrefix = "/guardpolicy/enforce/"
	ShadowPathPrefix  = "/guardpolicy/shadow/"
)

// PolicyHandler serves the webhooks the GuardPolicy controller installs:
// a validating one per Enforce policy, a mutating one per Shadow policy.
type PolicyHandler struct {
	*Checker
	// Policies reads GuardPolicies (a cache is fine: the policy's
	// generation is checked against the grant record, and revocations go
	// through the registry).
	Policies client.Reader
	// Recorder emits an Event for each write Shadow mode would deny.
	Recorder events.EventRecorder
	// Shadow selects the mutating, record-only behaviour.
	Shadow bool
}

var _ admission.Handler = &PolicyHandler{}

// Handle implements admission.Handler.
func (h *PolicyHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	prefix := EnforcePathPrefix
	if h.Shadow {
		prefix = ShadowPathPrefix
	}
	name := strings.TrimPrefix(pathOf(ctx), prefix)
	pol := &lockingv1alpha1.GuardPolicy{}
	if err := h.Policies.Get(ctx, types.NamespacedName{Name: name}, pol); err != nil {
		if h.Shadow {
			return admission.Allowed("policy not found")
		}
		return admission.Errored(http.StatusInternalServerError, err)
	}
	w, err := decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	covered := false
	for _, o := range []*object{w.old, w.new} {
		if o == nil {
			continue
		}
		ok, err := policy.Covers(pol, req.Resource.Group, req.Resource.Resource, req.Namespace, o.Labels)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		covered = covered || ok
	}
	if !covered || req.SubResource != "" {
		return admission.Allowed("")
	}
	decision := func() error {
		resource, err := policyResource(w, pol)
		if err != nil {
			return err
		}
		return h.check(ctx, w, resource, pol)
	}()
	mode := "enforce"
	if h.Shadow {
		mode = "shadow"
	}
	observe(mode, req, decision)
	if !h.Shadow {
		return respond(req, decision)
	}
	return h.shadow(req, w, pol, decision)
}

// shadow admits the write, and when Enforce would have denied it, says so
// in an Event, a metric and the object's shadow-denial annotation.
func (h *PolicyHandler) shadow(req admission.Request, w write, pol *lockingv1alpha1.GuardPolicy, decision error) admission.Response {
	reason := fencing.ReasonOf(decision)
	if decision != nil && reason == "" {
		return admission.Allowed("shadow mode: the check could not run: " + decision.Error())
	}
	if reason != "" {
		shadowDenials.WithLabelValues(pol.Name, string(reason)).Inc()
		if h.Recorder != nil && (req.DryRun == nil || !*req.DryRun) {
			regarding := &corev1.ObjectReference{
				APIVersion: req.Kind.Group + "/" + req.Kind.Version, Kind: req.Kind.Kind,
				Namespace: req.Namespace, Name: req.Name,
			}
			if req.Kind.Group == "" {
				regarding.APIVersion = req.Kind.Version
			}
			h.Recorder.Eventf(regarding, nil, corev1.EventTypeWarning, "ShadowDenied", string(req.Operation),
				"GuardPolicy %s (Shadow) would deny this %s: %s", pol.Name, strings.ToLower(string(req.Operation)), decision.Error())
		}
	}
	if w.new == nil {
		return admission.Allowed("")
	}
	const key = lockingv1alpha1.ShadowDenialAnnotation
	path := "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
	_, present := w.new.Annotations[key]
	switch {
	case reason != "" && w.new.Annotations == nil:
		return admission.Patched("", jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{key: decision.Error()}))
	case reason != "":
		return admission.Patched("", jsonpatch.NewOperation("add", path, decision.Error()))
	case present:
		return admission.Patched("", jsonpatch.NewOperation("remove", path, nil))
	}
	return admission.Allowed("")
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
