package guard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// overrideAsserted is the override a create or update asserts: the value
// of the override annotation on the new object, unless the stored object
// already carried it (an inherited annotation asserts nothing).
func overrideAsserted(w write) (string, bool) {
	if w.new == nil {
		return "", false
	}
	v, ok := w.new.Annotations[lockingv1alpha1.OverrideAnnotation]
	if !ok {
		return "", false
	}
	if w.old != nil {
		if was, had := w.old.Annotations[lockingv1alpha1.OverrideAnnotation]; had && was == v {
			return "", false
		}
	}
	return v, true
}

// gatherOverride adds to r the facts of an administrator's override: for
// a create or update that asserts one, its reason; for a delete of an
// object whose record is an override's, nothing more. Then whether the
// caller may override (a SubjectAccessReview) and the registry's fence
// for the object's resource.
func (c *Checker) gatherOverride(ctx context.Context, w write, r *fencing.GuardedRequest) error {
	if w.req.Operation == admissionv1.Delete {
		if !r.StoredGuarded || r.Record.Intent != fencing.IntentOverride {
			return nil
		}
		r.Override = &fencing.Override{}
	} else if reason, ok := overrideAsserted(w); ok {
		r.Override = &fencing.Override{Reason: reason}
	} else {
		return nil
	}
	allowed, err := c.mayOverride(ctx, w.req)
	if err != nil {
		return err
	}
	r.Override.Authorized = allowed
	if r.Counter == nil && r.Resource != "" && r.ObjectNamespace != "" {
		if r.Counter, err = facts.ReadCounter(ctx, c.Reader, r.ObjectNamespace, r.Resource); err != nil {
			return err
		}
	}
	return nil
}

// mayOverride asks the API server (a SubjectAccessReview) whether the
// requester may use the verb override on guardedobjects in the object's
// namespace. Without an Authorizer nobody may.
func (c *Checker) mayOverride(ctx context.Context, req admission.Request) (bool, error) {
	if c.Authorizer == nil {
		return false, nil
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, vals := range req.UserInfo.Extra {
		extra[k] = authorizationv1.ExtraValue(vals)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: req.Namespace, Verb: fencing.OverrideVerb, Group: lockingv1alpha1.GroupVersion.Group,
			Resource: fencing.OverrideResource, Name: req.Name,
		},
	}}
	if err := c.Authorizer.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("checking the %s permission: %w", fencing.OverrideVerb, err)
	}
	return sar.Status.Allowed, nil
}

// announce tells the operator, where it must act, about a decision that
// needs it: an accepted override (an Event on the object and on the
// FenceIssuer, and a log line), and a write refused because the object
// accepted more than the registry ever issued (FENCE_REGRESSION: an Event
// on the FenceIssuer, whose epoch must be raised). A dry run leaves no
// trace.
func (c *Checker) announce(ctx context.Context, req admission.Request, r fencing.GuardedRequest, decision error) {
	if req.DryRun != nil && *req.DryRun {
		return
	}
	obj := describeObject(req)
	switch {
	case decision == nil && r.Override != nil:
		note := fmt.Sprintf("%s overrode the guard of %s, which recorded fence %s of issuer epoch %d", req.UserInfo.Username, obj,
			fencing.FormatFence(r.Record.Fence), fencing.EpochOf(r.Record.Fence))
		if req.Operation == admissionv1.Delete {
			note = fmt.Sprintf("%s deleted %s after overriding its guard (recorded fence %s)", req.UserInfo.Username, obj, fencing.FormatFence(r.Record.Fence))
		} else {
			note += ": " + r.Override.Reason
		}
		logf.FromContext(ctx).Info("Guard overridden", "object", obj, "by", req.UserInfo.Username, "operation", string(req.Operation), "fence", r.Record.Fence)
		c.event(ctx, regarding(req), lockingv1alpha1.EventReasonGuardOverridden, note)
		c.event(ctx, c.issuer(ctx), lockingv1alpha1.EventReasonGuardOverridden, note)
	case fencing.ReasonOf(decision) == fencing.ReasonFenceRegression:
		var e *fencing.Error
		if !errors.As(decision, &e) {
			return
		}
		c.event(ctx, c.issuer(ctx), fencing.ReasonFenceRegression.ConditionReason(),
			fmt.Sprintf("%s refused a write under grant %s: %s", obj, r.Claim.Grant, e.Detail))
	}
}

// event emits a Warning Event regarding obj; nothing when either is
// missing.
func (c *Checker) event(_ context.Context, obj runtime.Object, reason, note string) {
	if c.Recorder == nil || obj == nil {
		return
	}
	c.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, reason, reason, "%s", note)
}

// issuer is the FenceIssuer, as the target of Events; nil when it cannot
// be read.
func (c *Checker) issuer(ctx context.Context) runtime.Object {
	iss := &lockingv1alpha1.FenceIssuer{}
	if err := c.Reader.Get(ctx, types.NamespacedName{Name: lockingv1alpha1.DefaultFenceIssuerName}, iss); err != nil {
		logf.FromContext(ctx).Error(err, "Reading the FenceIssuer for an Event")
		return nil
	}
	return iss
}

// regarding is a reference to the object of req.
func regarding(req admission.Request) *corev1.ObjectReference {
	ref := &corev1.ObjectReference{
		APIVersion: req.Kind.Group + "/" + req.Kind.Version, Kind: req.Kind.Kind,
		Namespace: req.Namespace, Name: req.Name,
	}
	if req.Kind.Group == "" {
		ref.APIVersion = req.Kind.Version
	}
	return ref
}

// describeObject names the object of req for people: "ConfigMap
// billing/ledger".
func describeObject(req admission.Request) string {
	kind := req.Kind.Kind
	if req.Kind.Group != "" {
		kind += "." + strings.SplitN(req.Kind.Group, ".", 2)[0]
	}
	return kind + " " + req.Namespace + "/" + req.Name
}
