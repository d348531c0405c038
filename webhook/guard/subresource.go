package guard

import (
	"context"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// opaqueSubresources are the subresources whose request body is not the
// object (a Scale, an Eviction, a Binding): it carries neither the object's
// labels, so no objectSelector matches it, nor a claim.
var opaqueSubresources = map[string]bool{"scale": true, "eviction": true, "binding": true}

func opaque(sub string) bool { return opaqueSubresources[sub] }

// SubresourceHandler is the validating webhook, without objectSelector, for
// the subresources whose body cannot carry a claim: */scale, pods/eviction,
// pods/binding. It reads the object itself and refuses the request when the
// object is guarded, by label or by an Enforce GuardPolicy: change such an
// object with a fenced write to the object (spec.replicas), and delete it
// with a pre-delete write and a delete. It is served by two webhooks of
// config/webhook/manifests.yaml: guard-subresource (failurePolicy Ignore,
// every such request: the API server cannot tell a guarded object's from any
// other's) and guard-binding-metadata (failurePolicy Fail, only bindings that
// would write lockwarden's labels or annotations into the Pod).
type SubresourceHandler struct {
	// Metadata reads the object's metadata directly from the API server.
	Metadata metadata.Interface
	// Policies reads GuardPolicies (a cache is fine).
	Policies client.Reader
}

var _ admission.Handler = &SubresourceHandler{}

// +kubebuilder:rbac:groups=*,resources=*,verbs=get

// Handle implements admission.Handler.
func (h *SubresourceHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if !opaque(req.SubResource) {
		return admission.Allowed("")
	}
	gvr := schema.GroupVersionResource{Group: req.Resource.Group, Version: req.Resource.Version, Resource: req.Resource.Resource}
	obj, err := h.Metadata.Resource(gvr).Namespace(req.Namespace).Get(ctx, req.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return admission.Allowed("") // the API server answers NotFound itself
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	}
	guarded := obj.Labels[lockingv1alpha1.GuardedLabel] == "true"
	if !guarded && h.Policies != nil {
		var list lockingv1alpha1.GuardPolicyList
		if err := h.Policies.List(ctx, &list); err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.Mode != lockingv1alpha1.ModeEnforce {
				continue
			}
			if ok, err := policy.Covers(p, req.Resource.Group, req.Resource.Resource, req.Namespace, obj.Labels); err == nil && ok {
				guarded = true
				break
			}
		}
	}
	if !guarded {
		return admission.Allowed("")
	}
	_, decision := fencing.CheckGuardedRequest(fencing.GuardedRequest{
		Operation: fencing.Operation(req.Operation), Subresource: req.SubResource, Opaque: true, Caller: req.UserInfo.Username,
	})
	observe("subresource", req, decision)
	return respond(req, decision)
}
