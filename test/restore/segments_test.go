package restore

// Multi-segment operations on Kubernetes objects.
//
// lockwarden's guarded-write webhook checks fences, not segments. For data
// that lives in Kubernetes objects, these tests model an operation the way
// a user would, with stock API server features around the webhook:
//
//   - An operation is ONE guarded ConfigMap, named after the operation's
//     root. Segment N is the data key "N", holding that segment's payload.
//     Segment 1 creates the object; segment N > 1 adds key "N" with a merge
//     patch. Every write carries the writer's grant and fence, so the
//     webhook refuses a stale owner and records the accepted fence on the
//     object in the same write.
//   - The receipt of a segment is the stored object itself: key "N" holds
//     the payload that was accepted, the object's fence annotation the
//     fence it last accepted, and its UID and resourceVersion identify the
//     accepted write. A writer that does not know whether its segment
//     landed reads the object instead of writing again. A resend of
//     segment 1 is the same create: the API server answers AlreadyExists,
//     and the object read back is the receipt, unchanged (same
//     resourceVersion: no second effect). A resend of segment N with the
//     same payload changes nothing.
//   - The segment rules the webhook does not know are a
//     ValidatingAdmissionPolicy (CEL, evaluated by the API server in the
//     same admission as the webhook) on objects labeled
//     segmentedLabel=true: accepted segments never change or disappear
//     (SEGMENT_CONFLICT; unlike the PostgreSQL store, the refused payload is
//     not quarantined, it is only in the refusal and the audit log), and the
//     keys are always exactly 1..n (SEQUENCE_GAP).
//
// Since segments live in the object, a restore of etcd rolls segments, the
// recorded fence and the registry back together (see TestRestoreFromOldSnapshot).

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// segmentedLabel marks a ConfigMap as a multi-segment operation.
const segmentedLabel = "test.lockwarden.io/segmented"

// installSegmentPolicy installs the segment rules and waits until the API
// server enforces them.
func installSegmentPolicy(ctx context.Context) error {
	pol := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-test-segments"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{segmentedLabel: "true"}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{
				{
					Expression: `oldObject == null || !has(oldObject.data) || oldObject.data.all(k, has(object.data) && k in object.data && object.data[k] == oldObject.data[k])`,
					Message:    "SEGMENT_CONFLICT: an accepted segment cannot change or disappear",
				},
				{
					Expression: `!has(object.data) || object.data.all(k, k.matches('^[1-9][0-9]{0,5}$') && int(k) <= size(object.data))`,
					Message:    "SEQUENCE_GAP: the segments of an operation are 1..n without gaps",
				},
			},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: pol.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        pol.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	if err := admin.Create(ctx, pol); err != nil {
		return fmt.Errorf("creating the segment policy: %w", err)
	}
	if err := admin.Create(ctx, binding); err != nil {
		return fmt.Errorf("creating the segment policy binding: %w", err)
	}
	// The API server picks policies up asynchronously: wait until a gap is
	// refused (the probe is not guarded, so only the policy judges it).
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		probe := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, GenerateName: "segment-policy-probe-", Labels: map[string]string{segmentedLabel: "true"}},
			Data:       map[string]string{"2": "a gap"},
		}
		last = admin.Create(ctx, probe, client.DryRunAll)
		return reason(last) == "SEQUENCE_GAP", nil
	})
	if err != nil {
		return fmt.Errorf("the segment policy is not enforced (last probe: %w): %w", last, err)
	}
	return nil
}

// operation is a multi-segment operation on a guarded ConfigMap.
type operation struct {
	ns, name, resource string
}

// write sends segment seq with payload as a, under grant g.
func (op operation) write(ctx context.Context, a *actor, g *lockingv1alpha1.LockGrant, seq int, payload string) error {
	annotations := map[string]string{
		lockingv1alpha1.ResourceAnnotation: op.resource,
		lockingv1alpha1.GrantAnnotation:    g.Name,
		lockingv1alpha1.FenceAnnotation:    fenceOf(g),
	}
	if seq == 1 {
		return a.c.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: op.ns, Name: op.name, Annotations: annotations,
				Labels: map[string]string{lockingv1alpha1.GuardedLabel: "true", segmentedLabel: "true"},
			},
			Data: map[string]string{"1": payload},
		})
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": annotations},
		"data":     map[string]string{strconv.Itoa(seq): payload},
	})
	if err != nil {
		return err
	}
	target := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: op.ns, Name: op.name}}
	return a.c.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch))
}

// state reads the operation's object: its segments and recorded fence.
// It is nil when no segment was ever accepted.
func (op operation) state(t *testing.T) *corev1.ConfigMap {
	t.Helper()
	return configMap(t, op.ns, op.name)
}
