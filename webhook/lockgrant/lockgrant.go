// Package lockgrant is the admission webhook of LockGrants: it binds each
// grant to the identity that created it and lets only that identity renew
// or release it, through the rules in pkg/fencing.
package lockgrant

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// Defaulter fills in what the API server knows and the client must not
// choose: the owner (the authenticated requester, when empty), the request
// time, the request-ID label, and whether the request ID reuses a spent
// one.
type Defaulter struct {
	Clock clock.PassiveClock
	// Ledgers reads the namespaces' RequestIDLedgers directly from the API
	// server: an entry written a moment before must be found. nil: request
	// IDs are not looked up.
	Ledgers client.Reader
}

var _ admission.Defaulter[*lockingv1alpha1.LockGrant] = &Defaulter{}

// NewDefaulter returns the mutating webhook of LockGrants. A request whose
// object does not decode (a field of the wrong JSON type, such as
// leaseDurationSeconds: 1.5 or "10") is refused as INVALID_SPEC naming the
// field, before the defaulter sees it. ledgers reads RequestIDLedgers
// directly (see Defaulter).
func NewDefaulter(s *runtime.Scheme, clk clock.PassiveClock, ledgers client.Reader) *admission.Webhook {
	wh := admission.WithDefaulter(s, &Defaulter{Clock: clk, Ledgers: ledgers})
	wh.Handler = typedFields{wh.Handler}
	return wh
}

// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=requestidledgers,verbs=get

// Default implements admission.Defaulter. It refuses a spec the schema
// would refuse (a resource ID, request ID or other string field of the
// wrong syntax or length), with INVALID_SPEC naming the field, before
// schema validation answers without a code. It refuses a request ID the
// namespace's RequestIDLedger holds as spent (fencing.CheckRequestID: the
// reason the earlier grant ended), and marks a grant that reuses one past
// its window (ReusedRequestIDAnnotation), unless its client generated the
// ID (GeneratedRequestIDAnnotation).
func (d *Defaulter) Default(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return err
	}
	if req.Operation != "CREATE" {
		return nil // registered for CREATE only; renew and release skip it
	}
	if errs := syntaxErrors(&g.Spec); len(errs) > 0 {
		return invalid(g.Name, errs...)
	}
	if g.Spec.RequestID != "" {
		if g.Labels == nil {
			g.Labels = map[string]string{}
		}
		g.Labels[lockingv1alpha1.RequestIDLabel] = g.Spec.RequestID
	}
	if g.Spec.RequestID != "" && g.Name == "" {
		// Named after the request ID, so that a retried create of the same
		// request fails with AlreadyExists instead of queuing twice.
		g.Name = lockingv1alpha1.GrantNameForRequest(g.Spec.RequestID)
	}
	if g.Spec.Owner == "" {
		g.Spec.Owner = req.UserInfo.Username
	}
	stampRequest(g, req.UserInfo, d.Clock.Now())
	delete(g.Annotations, lockingv1alpha1.ReusedRequestIDAnnotation)
	return d.checkRequestID(ctx, req.Namespace, g)
}

// checkRequestID looks g's request ID up in namespace ns's RequestIDLedger:
// a spent ID is refused, one whose window passed is marked.
func (d *Defaulter) checkRequestID(ctx context.Context, ns string, g *lockingv1alpha1.LockGrant) error {
	if d.Ledgers == nil || g.Spec.RequestID == "" || g.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] == "true" {
		return nil
	}
	spent, err := facts.ReadSpentRequest(ctx, d.Ledgers, ns, g.Spec.RequestID)
	if err != nil {
		return err
	}
	notice, err := fencing.CheckRequestID(spent, d.Clock.Now())
	if err != nil {
		return forbidden(g.Name, err)
	}
	if notice != "" {
		g.Annotations[lockingv1alpha1.ReusedRequestIDAnnotation] = spent.State.String() + " " + spent.EndedAt.UTC().Format(time.RFC3339)
	}
	return nil
}

// Validator refuses a spoofed owner, a request its GuardPolicy does not
// allow, any renew or release that is not the owner's or that the grant's
// state does not allow, and a forced release without its permission.
type Validator struct {
	Clock clock.PassiveClock
	// Reader reads GuardPolicies and namespaces.
	Reader client.Reader
	// Authorizer answers SubjectAccessReviews for forced releases.
	Authorizer client.Client
	// Sessions reads session Leases directly from the API server: a Lease
	// created a moment before the request must be found.
	Sessions client.Reader
	// PodGrants, when set, accepts the grants the manager requests for
	// lock-gated Pods (podgrant.go).
	PodGrants *PodGrants
	// RequestIDWindow is the manager's request-ID window, and Ledgers
	// reads the namespaces' RequestIDLedgers directly from the API server:
	// an ended grant of a user-chosen request ID is deleted only once its
	// ID is recorded as spent. A zero window records nothing.
	RequestIDWindow time.Duration
	Ledgers         client.Reader
}

// WithRequestIDWindow makes the validator keep an ended grant of a
// user-chosen request ID until the ledger of its namespace, read with
// ledgers, records the ID as spent (window: the manager's request-ID
// window).
func WithRequestIDWindow(window time.Duration, ledgers client.Reader) func(*Validator) {
	return func(v *Validator) { v.RequestIDWindow, v.Ledgers = window, ledgers }
}

// ForceReleaseVerb is the RBAC verb on lockgrants that lets an identity
// delete (force-release) a live grant it does not own: fencing.ForceReleaseVerb.
const ForceReleaseVerb = fencing.ForceReleaseVerb

// AdministerVerb is the RBAC verb on lockgrants that lets an identity change
// the metadata of a grant it does not own: fencing.AdministerVerb.
const AdministerVerb = fencing.AdministerVerb

var _ admission.Validator[*lockingv1alpha1.LockGrant] = &Validator{}

// NewValidator returns the validating webhook of LockGrants.
func NewValidator(s *runtime.Scheme, clk clock.PassiveClock, r client.Reader, authz client.Client, sessions client.Reader, opts ...func(*Validator)) *admission.Webhook {
	v := &Validator{Clock: clk, Reader: r, Authorizer: authz, Sessions: sessions}
	for _, o := range opts {
		o(v)
	}
	return admission.WithValidator(s, v)
}

// ValidateCreate checks that the owner is the requester and that the
// request starts fresh: no renewals. A request may be created already
// released (spec.release): it is withdrawn at birth, never granted, and
// spends its request ID, which is how a client that lost track of a create
// makes sure it never takes effect (pkg/lock).
func (v *Validator) ValidateCreate(ctx context.Context, g *lockingv1alpha1.LockGrant) (admission.Warnings, error) {
	user, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	if err := v.checkOwner(ctx, g, user); err != nil {
		return nil, answer(g.Name, err)
	}
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if g.Spec.Renewals != 0 {
		errs = append(errs, deny.FieldInvalid(spec.Child("renewals"), g.Spec.Renewals, fencing.ReasonInvalidSpec, "a new LockGrant must have renewals 0"))
	}
	if g.Spec.RequestID != "" {
		if want := lockingv1alpha1.GrantNameForRequest(g.Spec.RequestID); g.Name != want {
			errs = append(errs, deny.FieldInvalid(field.NewPath("metadata", "name"), g.Name, fencing.ReasonInvalidSpec,
				fmt.Sprintf("a LockGrant with requestID %q must be named %q (or use generateName)", g.Spec.RequestID, want)))
		}
	}
	if err := invalid(g.Name, errs...); err != nil {
		return nil, err
	}
	if g.Spec.Session != nil {
		if err := v.checkSession(ctx, g); err != nil {
			return nil, err
		}
	}
	var warnings admission.Warnings
	if ended, ok := g.Annotations[lockingv1alpha1.ReusedRequestIDAnnotation]; ok {
		warnings = append(warnings, fmt.Sprintf("request ID %q was spent by an earlier grant (ended %s) whose window has passed: this request runs as a new attempt", g.Spec.RequestID, ended))
	}
	if g.Spec.Policy != "" {
		return warnings, v.checkPolicy(ctx, g)
	}
	return warnings, nil
}

// checkSession refuses a request that names a session Lease that is not
// the requester's: it must exist in the grant's namespace with the UID the
// request names (SESSION_EXPIRED otherwise), carry the session label and a
// lease duration (INVALID_SPEC), and name the owner as its holder
// (NOT_OWNER). Whether the session is still live is the controller's
// decision, by its own observations.
func (v *Validator) checkSession(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	ref := g.Spec.Session
	l := &coordinationv1.Lease{}
	err := v.Sessions.Get(ctx, types.NamespacedName{Namespace: g.Namespace, Name: ref.Name}, l)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading session Lease %s/%s: %w", g.Namespace, ref.Name, err)
	}
	lease := fencing.SessionLease{Namespace: g.Namespace, Name: ref.Name, UID: ref.UID, Found: err == nil, Label: lockingv1alpha1.SessionLabel}
	if lease.Found {
		lease.ActualUID = string(l.UID)
		lease.Labeled = l.Labels[lockingv1alpha1.SessionLabel] == "true"
		lease.HasDuration = l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds >= 1
		if l.Spec.HolderIdentity != nil {
			lease.Holder, lease.HasHolder = *l.Spec.HolderIdentity, true
		}
	}
	return refusal(g.Name, field.NewPath("spec", "session", "name"), ref.Name, fencing.CheckSessionLease(lease, g.Spec.Owner))
}

// checkPolicy refuses a request its GuardPolicy does not allow.
func (v *Validator) checkPolicy(ctx context.Context, g *lockingv1alpha1.LockGrant) error {
	pol := &lockingv1alpha1.GuardPolicy{}
	if err := v.Reader.Get(ctx, types.NamespacedName{Name: g.Spec.Policy}, pol); err != nil {
		if apierrors.IsNotFound(err) {
			return invalid(g.Name, deny.FieldInvalid(field.NewPath("spec", "policy"), g.Spec.Policy, fencing.ReasonInvalidSpec, "no such GuardPolicy"))
		}
		return err
	}
	return refusal(g.Name, field.NewPath("spec", "leaseDurationSeconds"), g.Spec.LeaseDurationSeconds,
		policy.CheckGrant(pol, g.Spec.Owner, policy.Groups(g), g.Spec.LeaseDurationSeconds))
}

// ValidateUpdate judges an update of a grant (not its status) by
// fencing.CheckGrantUpdate: immutable metadata stays (INVALID_SPEC, naming
// the fields), others change metadata only with the administer verb and
// never renew or release (NOT_OWNER), and the owner (or the grant's
// steward) renews or releases only while the grant's state allows it; once a grant has ended, its owner
// cannot change it any more. Whether the lease was still running is the
// controller's judgement, by its clock against the lease the counter
// records: a late renew or release ends the grant Expired.
//
// The ValidatingAdmissionPolicy of config/policy judges the same updates in
// the API server (without a call here): the owner's own renews and
// releases, which change no metadata, are judged there alone (this
// webhook's matchConditions skip them). The API server calls this webhook
// for the others, so that without the policy's binding the identity rules
// still hold.
func (v *Validator) ValidateUpdate(ctx context.Context, oldG, newG *lockingv1alpha1.LockGrant) (admission.Warnings, error) {
	user, err := requester(ctx)
	if err != nil {
		return nil, err
	}
	u := facts.GrantUpdate(user, oldG, newG, func() (bool, error) { return v.authorized(ctx, newG, AdministerVerb) })
	err = fencing.CheckGrantUpdate(u)
	if fencing.ReasonOf(err) == fencing.ReasonInvalidSpec && len(u.Immutable) > 0 {
		errs := make(field.ErrorList, 0, len(u.Immutable))
		for _, f := range u.Immutable {
			path, value := immutableField(newG, f)
			errs = append(errs, deny.FieldInvalid(path, value, fencing.ReasonInvalidSpec, "immutable"))
		}
		return nil, invalid(newG.Name, errs...)
	}
	return nil, answer(newG.Name, err)
}

// immutableField is the field path and value in g of an immutable metadata
// field named as facts.GrantUpdate names it ("metadata.annotations[KEY]",
// "metadata.labels[KEY]").
func immutableField(g *lockingv1alpha1.LockGrant, f string) (*field.Path, string) {
	key := strings.TrimSuffix(f[strings.IndexByte(f, '[')+1:], "]")
	if strings.HasPrefix(f, "metadata.labels[") {
		return field.NewPath("metadata", "labels").Key(key), g.Labels[key]
	}
	return field.NewPath("metadata", "annotations").Key(key), g.Annotations[key]
}

// ValidateDelete lets the owner delete its grant, anyone with delete
// rights delete a finished one, and otherwise requires the force-release
// verb: deleting a live grant someone else holds is a forced release, a
// separate and audited action (the next grant gets a higher fence). A grant
// of a request ID its user chose goes only once nothing forgets the ID: not
// live by its owner, and once ended only after the namespace's ledger
// records the ID as spent. Grants in a namespace being deleted can always
// go.
func (v *Validator) ValidateDelete(ctx context.Context, g *lockingv1alpha1.LockGrant) (admission.Warnings, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var ended, now time.Time
	if g.Status.EndedAt != nil {
		ended = g.Status.EndedAt.Time
	}
	if v.RequestIDWindow > 0 {
		now = v.Clock.Now()
	}
	d := fencing.GrantDelete{
		Caller: req.UserInfo.Username, Owner: g.Spec.Owner, Phase: phaseWord(g), Ended: g.Status.Phase.Final(),
		RequestID: chosenRequestID(g),
		EndedAt:   ended, Now: now, Window: v.RequestIDWindow,
		Recorded: func() (bool, error) {
			if v.Ledgers == nil {
				return false, nil
			}
			spent, err := facts.ReadSpentRequest(ctx, v.Ledgers, g.Namespace, g.Spec.RequestID)
			return spent.Records(ended, v.RequestIDWindow), err
		},
		NamespaceTerminating: func() bool {
			terminating, err := facts.NamespaceTerminating(ctx, v.Reader, g.Namespace)
			return err == nil && terminating
		},
		ForceRelease: func() (bool, error) { return v.authorized(ctx, g, ForceReleaseVerb) },
	}
	forced, err := fencing.CheckGrantDelete(d)
	if err != nil {
		return nil, answer(g.Name, err)
	}
	if !forced {
		return nil, nil
	}
	log := logf.FromContext(ctx)
	if ptr.Deref(req.DryRun, false) {
		// Nothing is released: the requester sees the warning, and the
		// log of forced releases keeps only those that happened.
		log = log.V(1).WithValues("dryRun", true)
	}
	log.Info("Forced release", "grant", klog.KObj(g), "by", req.UserInfo.Username, "owner", g.Spec.Owner, "fence", g.Status.FenceToken)
	return admission.Warnings{fmt.Sprintf("forced release of %s's grant (fence %d)", g.Spec.Owner, g.Status.FenceToken)}, nil
}

// chosenRequestID is g's request ID when its user chose it, one a retry
// could reuse; "" for none, one its client generated, or a gated Pod's: a
// grant the manager requested for a Pod (admission stamped its steward,
// which nobody else can set), not any ID a user chose that starts with
// "pod-".
func chosenRequestID(g *lockingv1alpha1.LockGrant) string {
	id := g.Spec.RequestID
	podGrant := strings.HasPrefix(id, lockingv1alpha1.PodRequestIDPrefix) && g.Annotations[lockingv1alpha1.StewardAnnotation] != ""
	if id == "" || g.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] == "true" || podGrant {
		return ""
	}
	return id
}

// phaseWord is g's phase for a message; Pending before its first status.
func phaseWord(g *lockingv1alpha1.LockGrant) string {
	if g.Status.Phase == "" {
		return string(lockingv1alpha1.PhasePending)
	}
	return string(g.Status.Phase)
}

// authorized asks the API server (a SubjectAccessReview) whether the
// requester may use verb on grant g.
func (v *Validator) authorized(ctx context.Context, g *lockingv1alpha1.LockGrant, verb string) (bool, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return false, err
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, vals := range req.UserInfo.Extra {
		extra[k] = authorizationv1.ExtraValue(vals)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: req.UserInfo.Username, UID: req.UserInfo.UID, Groups: req.UserInfo.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: g.Namespace, Verb: verb, Group: lockingv1alpha1.GroupVersion.Group,
			Resource: "lockgrants", Name: g.Name,
		},
	}}
	if err := v.Authorizer.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("checking the %s permission: %w", verb, err)
	}
	return sar.Status.Allowed, nil
}

func requester(ctx context.Context) (string, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return "", err
	}
	return req.UserInfo.Username, nil
}

// forbidden turns a fencing refusal into a Forbidden admission error whose
// message starts with the reason code.
func forbidden(name string, err error) error {
	return deny.Error(err, lockingv1alpha1.GroupVersion.WithResource("lockgrants").GroupResource(), name)
}

// refusal is err as the admission error of grant name: a refusal with
// INVALID_SPEC is an Invalid error about path with value, any other refusal
// is denied (Forbidden), and an error that is no refusal (a failed read) is
// returned as is. nil for nil.
func refusal(name string, path *field.Path, value any, err error) error {
	if fencing.ReasonOf(err) == fencing.ReasonInvalidSpec {
		return invalid(name, deny.Field(path, value, err))
	}
	return answer(name, err)
}

// answer is err as the admission error of grant name: a refusal is denied
// (Forbidden), an error that is no refusal (a failed authorization request)
// is returned as is. nil for nil.
func answer(name string, err error) error {
	if fencing.ReasonOf(err) == "" {
		return err
	}
	return forbidden(name, err)
}

// invalid is the 422 Invalid error of grant name for errs (nil for none).
func invalid(name string, errs ...*field.Error) error {
	return deny.Invalid(lockingv1alpha1.GroupVersion.WithKind("LockGrant").GroupKind(), name, errs)
}

// typedFields refuses a request whose LockGrant does not decode because a
// field has the wrong JSON type, with INVALID_SPEC naming the field, instead
// of the decoder's Go error; other requests go to the wrapped handler.
type typedFields struct{ next admission.Handler }

// Handle implements admission.Handler.
func (h typedFields) Handle(ctx context.Context, req admission.Request) admission.Response {
	if errs := fieldTypeErrors(req.Object.Raw); len(errs) > 0 {
		return deny.InvalidResponse(lockingv1alpha1.GroupVersion.WithKind("LockGrant").GroupKind(), req.Name, errs)
	}
	return h.next.Handle(ctx, req)
}

// fieldTypeErrors returns the field whose JSON type does not fit the
// LockGrant type in raw, if any.
func fieldTypeErrors(raw []byte) field.ErrorList {
	if len(raw) == 0 {
		return nil
	}
	var te *json.UnmarshalTypeError
	if err := json.Unmarshal(raw, &lockingv1alpha1.LockGrant{}); !errors.As(err, &te) || te.Field == "" {
		return nil // decodes, or fails in a way the decoder itself reports
	}
	parts := strings.Split(te.Field, ".")
	return field.ErrorList{deny.FieldInvalid(field.NewPath(parts[0], parts[1:]...), valueAt(raw, parts, te.Value), fencing.ReasonInvalidSpec,
		"must be "+jsonType(te.Type))}
}

// valueAt is the JSON value at path in raw, as the user wrote it, or
// otherwise the decoder's description of it.
func valueAt(raw []byte, path []string, otherwise string) any {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return otherwise
	}
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return otherwise
		}
		v = m[p]
	}
	return v
}

// jsonType says in JSON terms what a Go type accepts.
func jsonType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "an object"
	}
	return "a " + t.String()
}
