// Package guard is the guarded-write admission webhook: the enforcement
// point of the fencing rules for Kubernetes objects. An object labeled
// locking.lockwarden.io/guarded=true can be created, updated or deleted only
// by the owner of the resource's current grant, carrying that grant's fence.
//
// The webhook gathers the facts (the object's recorded fence, the grant and
// the resource's FenceCounter, both read directly from the API server) and
// calls fencing.CheckWrite. It has no side effects: an accepted write
// records its own fence in the object's locking.lockwarden.io/fence
// annotation, so the check and the record are one atomic write. If the
// write then fails on a resourceVersion conflict, nothing was recorded, and
// the retry is checked again against the fresh object.
package guard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/facts"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Handler is the guarded-write webhook.
type Handler struct {
	// Reader reads grants and counters directly from the API server (a
	// linearizable read; never an informer cache).
	Reader client.Reader
	// Clock is the clock leases are judged by; the controller's.
	Clock clock.PassiveClock
}

var _ admission.Handler = &Handler{}

// NewWebhook returns the guarded-write webhook.
func NewWebhook(r client.Reader, clk clock.PassiveClock) *admission.Webhook {
	return &admission.Webhook{Handler: &Handler{Reader: r, Clock: clk}}
}

// object is the part of any Kubernetes object the webhook reads.
type object struct {
	metav1.ObjectMeta `json:"metadata"`
}

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	oldObj, newObj, err := decode(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	decision := h.decide(ctx, req, oldObj, newObj)
	observe(req, decision)
	if decision == nil {
		return admission.Allowed("")
	}
	if fencing.ReasonOf(decision) == "" {
		return admission.Errored(http.StatusInternalServerError, decision)
	}
	logf.FromContext(ctx).V(1).Info("Guarded write denied", "reason", fencing.ReasonOf(decision), "user", req.UserInfo.Username, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name)
	return admission.Denied(decision.Error())
}

// decide gathers the facts of one guarded write and applies the fencing
// rules. It returns nil to admit.
func (h *Handler) decide(ctx context.Context, req admission.Request, oldObj, newObj *object) error {
	oldGuarded, newGuarded := guarded(oldObj), guarded(newObj)
	if !oldGuarded && !newGuarded {
		return nil
	}

	// The resource: what the object was guarded by, else what it will be.
	var resource string
	switch {
	case oldGuarded:
		resource = oldObj.Annotations[lockingv1alpha1.ResourceAnnotation]
		if newGuarded && newObj.Annotations[lockingv1alpha1.ResourceAnnotation] != resource {
			return &fencing.Error{Reason: fencing.ReasonBindingMismatch, Detail: "annotation " + lockingv1alpha1.ResourceAnnotation + " cannot change while the object is guarded"}
		}
	default:
		resource = newObj.Annotations[lockingv1alpha1.ResourceAnnotation]
	}
	if !lockingv1alpha1.ValidResourceID(resource) {
		return &fencing.Error{Reason: fencing.ReasonNoResource, Detail: fmt.Sprintf("guarded objects need annotation %s with a valid resource ID, got %q", lockingv1alpha1.ResourceAnnotation, resource)}
	}

	// The write's grant and fence: from the new object, or, for a delete,
	// from the stored one (write your grant onto the object, then delete it
	// with a resourceVersion precondition).
	carrier := newObj
	if req.Operation == admissionv1.Delete {
		carrier = oldObj
	}
	fence, err := fencing.ParseFence(carrier.Annotations[lockingv1alpha1.FenceAnnotation])
	if err != nil {
		return err
	}
	grantKey, err := grantRef(carrier.Annotations[lockingv1alpha1.GrantAnnotation], req.Namespace)
	if err != nil {
		return err
	}
	var recorded int64
	if oldGuarded {
		// A value this webhook accepted before; unreadable means none.
		recorded, _ = fencing.ParseFence(oldObj.Annotations[lockingv1alpha1.FenceAnnotation])
	}

	grant := &lockingv1alpha1.LockGrant{}
	switch err := h.Reader.Get(ctx, grantKey, grant); {
	case apierrors.IsNotFound(err):
		grant = nil
	case err != nil:
		return fmt.Errorf("reading grant %s: %w", grantKey, err)
	}
	counter := &lockingv1alpha1.FenceCounter{}
	counterKey := types.NamespacedName{Namespace: grantKey.Namespace, Name: lockingv1alpha1.FenceCounterName(resource)}
	switch err := h.Reader.Get(ctx, counterKey, counter); {
	case apierrors.IsNotFound(err):
		counter = nil
	case err != nil:
		return fmt.Errorf("reading fence counter %s: %w", counterKey, err)
	}

	return fencing.CheckWrite(fencing.Write{
		Resource: resource,
		Caller:   req.UserInfo.Username,
		Fence:    fence,
		Recorded: recorded,
		Grant:    facts.Grant(grant),
		Counter:  facts.Counter(counter),
		Now:      h.Clock.Now(),
	})
}

func guarded(o *object) bool {
	return o != nil && o.Labels[lockingv1alpha1.GuardedLabel] == "true"
}

// grantRef parses "NAME" or "NAMESPACE/NAME".
func grantRef(s, objNamespace string) (types.NamespacedName, error) {
	ns, name, found := strings.Cut(s, "/")
	if !found {
		ns, name = objNamespace, s
	}
	if name == "" || ns == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, &fencing.Error{Reason: fencing.ReasonNoFence,
			Detail: fmt.Sprintf("the write must name its grant in annotation %s as NAME or NAMESPACE/NAME, got %q", lockingv1alpha1.GrantAnnotation, s)}
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

func decode(req admission.Request) (oldObj, newObj *object, err error) {
	parse := func(raw []byte) (*object, error) {
		if len(raw) == 0 {
			return nil, nil
		}
		o := &object{}
		if err := json.Unmarshal(raw, o); err != nil {
			return nil, fmt.Errorf("decoding object: %w", err)
		}
		return o, nil
	}
	if oldObj, err = parse(req.OldObject.Raw); err != nil {
		return nil, nil, err
	}
	newObj, err = parse(req.Object.Raw)
	return oldObj, newObj, err
}
