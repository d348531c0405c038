package lockgrant_test

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clocktesting "k8s.io/utils/clock/testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/webhook/lockgrant"
)

// lockGrantMatchCondition is the CEL expression of the LockGrant
// validating webhook's match condition name in config/webhook.
func lockGrantMatchCondition(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../../config/webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var cfg admissionregistrationv1.ValidatingWebhookConfiguration
		if err := dec.Decode(&cfg); err != nil {
			break
		}
		for _, wh := range cfg.Webhooks {
			if wh.Name != "vlockgrant.locking.lockwarden.io" {
				continue
			}
			for _, mc := range wh.MatchConditions {
				if mc.Name == name {
					return mc.Expression
				}
			}
		}
	}
	t.Fatalf("no match condition %q on the LockGrant validating webhook", name)
	return ""
}

// The API server skips the LockGrant webhook for the deletes its match
// condition leaves out, so every delete it leaves out must be one the
// webhook would allow whatever it found: with the request-ID window on,
// the ID not recorded in the ledger, the namespace not terminating and the
// caller without the force-release verb. A delete the condition skips but
// ValidateDelete refuses would go through unjudged.
func TestDeletesTheMatchConditionSkipsAreAllowed(t *testing.T) {
	env, err := cel.NewEnv(cel.OptionalTypes(), cel.Variable("request", cel.DynType),
		cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(lockGrantMatchCondition(t, "not-an-unconditional-delete"))
	if iss.Err() != nil {
		t.Fatal(iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	ended := time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)
	v := &lockgrant.Validator{
		Clock:  clocktesting.NewFakePassiveClock(ended.Add(time.Minute)),
		Reader: objects{"ns": &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}}, Authorizer: authorizer{asked: new(int)},
		RequestIDWindow: time.Hour, Ledgers: objects{},
	}
	unset := "<unset>"
	checked, skipped := 0, 0
	for _, id := range []string{"", "nightly-1", "pod-nightly-1", lockingv1alpha1.PodRequestID("u-1"), "POD-x"} {
		for _, steward := range []string{unset, "", "system:serviceaccount:lockwarden-system:manager"} {
			for _, generated := range []string{unset, "", "true", "True", "false"} {
				for _, ph := range []lockingv1alpha1.LockGrantPhase{"", lockingv1alpha1.PhasePending, lockingv1alpha1.PhaseHeld,
					lockingv1alpha1.PhaseReleased, lockingv1alpha1.PhaseExpired, lockingv1alpha1.PhaseTimedOut, lockingv1alpha1.PhaseRevoked} {
					for _, caller := range []string{"alice", "bob"} {
						g := &lockingv1alpha1.LockGrant{Spec: lockingv1alpha1.LockGrantSpec{Resource: "r", Owner: "alice", RequestID: id}}
						g.Name, g.Namespace, g.Status.Phase = "g-1", "ns", ph
						if ph.Final() {
							g.Status.EndedAt = &metav1.MicroTime{Time: ended}
						}
						for k, val := range map[string]string{lockingv1alpha1.StewardAnnotation: steward, lockingv1alpha1.GeneratedRequestIDAnnotation: generated} {
							if val != unset {
								if g.Annotations == nil {
									g.Annotations = map[string]string{}
								}
								g.Annotations[k] = val
							}
						}
						u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(g)
						if err != nil {
							t.Fatal(err)
						}
						out, _, err := prg.Eval(map[string]any{
							"request":   map[string]any{"operation": "DELETE", "userInfo": map[string]any{"username": caller}},
							"object":    nil,
							"oldObject": u,
						})
						what := fmt.Sprintf("%s's delete of a %q grant with request ID %q, steward %q, generated %q", caller, ph, id, steward, generated)
						if err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						checked++
						if out.Value() == true {
							continue // the webhook judges it
						}
						skipped++
						if _, err := v.ValidateDelete(asUser(caller, admissionv1.Delete), g); err != nil {
							t.Errorf("%s: the match condition skips the webhook, which would refuse it: %v", what, err)
						}
					}
				}
			}
		}
	}
	if skipped == 0 || skipped == checked {
		t.Fatalf("the match condition skipped %d of %d deletes", skipped, checked)
	}
}
