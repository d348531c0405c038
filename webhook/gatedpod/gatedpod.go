package gatedpod

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/internal/podgate"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// Handler is the mutating webhook of Pods that name a lock, on CREATE.
type Handler struct {
	// Decoder decodes the Pod.
	Decoder admission.Decoder
	// Authorizer answers SubjectAccessReviews.
	Authorizer client.Client
	// Clock stamps the admission time; it must be the controller's clock.
	Clock clock.PassiveClock
}

var _ admission.Handler = &Handler{}

// managerAnnotations are written on a gated Pod by the manager only, when
// it starts the Pod: a value sent at creation is removed.
var managerAnnotations = []string{
	lockingv1alpha1.GrantAnnotation, lockingv1alpha1.GrantUIDAnnotation, lockingv1alpha1.FenceAnnotation,
	lockingv1alpha1.ProofAnnotation, lockingv1alpha1.FencedResourceAnnotation,
}

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if req.Operation != "CREATE" || !podgate.Named(pod.Annotations) {
		return admission.Allowed("")
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName
	}
	r, errs := podgate.ParseRequest(pod.Annotations)
	if len(errs) > 0 {
		return deny.InvalidResponse(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), name, errs)
	}
	owner := podgate.Owner(req.Namespace, podgate.ServiceAccount(pod))
	err := fencing.CheckGatedPod(fencing.GatedPod{
		Namespace: req.Namespace, Owner: owner, NodeName: pod.Spec.NodeName,
		MayAcquire: func() (bool, error) { return h.mayAcquire(ctx, req.Namespace, owner) },
	})
	switch {
	case fencing.ReasonOf(err) == fencing.ReasonInvalidSpec:
		return deny.InvalidResponse(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), name,
			field.ErrorList{deny.Field(field.NewPath("spec", "nodeName"), pod.Spec.NodeName, err)})
	case fencing.ReasonOf(err) != "":
		return deny.Response(err, corev1.SchemeGroupVersion.WithResource("pods").GroupResource(), name)
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("%s: %w", fencing.ReasonInternal, err))
	}
	gate(pod, h.Clock.Now())
	raw, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw)
	resp.Warnings = append(resp.Warnings, fmt.Sprintf("the Pod waits for lock %s as %s before it is scheduled", r.Resource, owner))
	return resp
}

// gate holds pod back until its grant is Held, labels it for the
// manager's cache, and stamps its admission time at now.
func gate(pod *corev1.Pod, now time.Time) {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[lockingv1alpha1.GatedLabel] = "true"
	for _, a := range managerAnnotations {
		delete(pod.Annotations, a)
	}
	pod.Annotations[lockingv1alpha1.RequestedAtAnnotation] = now.UTC().Format(time.RFC3339Nano)
	if !podgate.Gated(pod) {
		pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: lockingv1alpha1.PodSchedulingGate})
	}
}

// mayAcquire asks the authorizer whether owner, a ServiceAccount user with
// the groups the API server authenticates it in, may create LockGrants in
// ns.
func (h *Handler) mayAcquire(ctx context.Context, ns, owner string) (bool, error) {
	return facts.MayAcquire(ctx, h.Authorizer, ns, owner, podgate.OwnerGroups(owner))
}
