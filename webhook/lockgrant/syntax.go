package lockgrant

import (
	"fmt"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// The syntax of the spec's string fields, the API's patterns, which the
// CRD schema states too (TestSyntaxMatchesSchema keeps the two in
// agreement). The schema stays
// the last word; admission checks the same first, because the mutating
// webhook runs before schema validation and can answer with the
// INVALID_SPEC code and the field a user set, where the schema's own
// message carries no code.
var (
	requestIDRE      = regexp.MustCompile(lockingv1alpha1.RequestIDPattern)
	operationRootRE  = regexp.MustCompile(lockingv1alpha1.OperationRootPattern)
	operationClassRE = regexp.MustCompile(lockingv1alpha1.OperationClassPattern)
	resourceRE       = regexp.MustCompile(lockingv1alpha1.ResourcePattern)
)

// stringRule is the schema of one string field: its bounds and pattern;
// a field that is not set is not checked.
type stringRule struct {
	path     *field.Path
	min, max int
	re       *regexp.Regexp
	// syntax says in words what the pattern accepts.
	syntax string
}

func (r stringRule) check(v string, set bool) *field.Error {
	if !set {
		return nil
	}
	switch {
	case len(v) < r.min:
		return deny.FieldInvalid(r.path, v, fencing.ReasonInvalidSpec, "must not be empty")
	case r.max > 0 && len(v) > r.max:
		return deny.FieldInvalid(r.path, v, fencing.ReasonInvalidSpec, fmt.Sprintf("must be at most %d bytes, not %d", r.max, len(v)))
	case r.re != nil && v != "" && !r.re.MatchString(v):
		return deny.FieldInvalid(r.path, v, fencing.ReasonInvalidSpec, "must be "+r.syntax)
	}
	return nil
}

var (
	spec = field.NewPath("spec")
	// specRules is every string field of a LockGrant's spec the schema
	// bounds, in the schema's order.
	specRules = []struct {
		rule stringRule
		get  func(*lockingv1alpha1.LockGrantSpec) (string, bool)
	}{
		{stringRule{spec.Child("resource"), 1, lockingv1alpha1.MaxResourceLength, resourceRE,
			`one or more segments separated by "/", each of lowercase letters, digits, ".", "_" and "-", starting and ending with a letter or digit`},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) { return s.Resource, true }},
		{stringRule{spec.Child("owner"), 0, 253, nil, ""},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) { return s.Owner, s.Owner != "" }},
		{stringRule{spec.Child("requestID"), 0, lockingv1alpha1.MaxRequestIDLength, requestIDRE,
			`letters, digits, ".", "_" and "-", starting and ending with a letter or digit`},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) { return s.RequestID, s.RequestID != "" }},
		{stringRule{spec.Child("operationRoot"), 0, 0, operationRootRE, `"sha256:" and 64 lowercase hex digits`},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) { return s.OperationRoot, s.OperationRoot != "" }},
		{stringRule{spec.Child("operationClass"), 0, lockingv1alpha1.MaxOperationClassLength, operationClassRE,
			`lowercase letters, digits and "-", starting and ending with a letter or digit`},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) { return s.OperationClass, s.OperationClass != "" }},
		{stringRule{spec.Child("policy"), 0, 253, nil, ""},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) { return s.Policy, s.Policy != "" }},
		{stringRule{spec.Child("session", "name"), 1, 253, nil, ""},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) {
				if s.Session == nil {
					return "", false
				}
				return s.Session.Name, true
			}},
		{stringRule{spec.Child("session", "uid"), 1, 128, nil, ""},
			func(s *lockingv1alpha1.LockGrantSpec) (string, bool) {
				if s.Session == nil {
					return "", false
				}
				return s.Session.UID, true
			}},
	}
)

// syntaxErrors returns what the schema would refuse in s's string fields
// and counts, each as INVALID_SPEC naming the field.
func syntaxErrors(s *lockingv1alpha1.LockGrantSpec) field.ErrorList {
	var errs field.ErrorList
	for _, r := range specRules {
		v, set := r.get(s)
		if err := r.rule.check(v, set); err != nil {
			errs = append(errs, err)
		}
	}
	if s.Renewals < 0 {
		errs = append(errs, deny.FieldInvalid(spec.Child("renewals"), s.Renewals, fencing.ReasonInvalidSpec, "must not be negative"))
	}
	return errs
}
