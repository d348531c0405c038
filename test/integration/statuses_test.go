package integration

import (
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// statusPatch merges status into g's status as a controller writes it,
// without a resourceVersion: the API server alone judges the transition.
func statusPatch(t *testing.T, g *lockingv1alpha1.LockGrant, status map[string]any) error {
	t.Helper()
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		t.Fatal(err)
	}
	return admin.Status().Patch(t.Context(), &lockingv1alpha1.LockGrant{ObjectMeta: g.ObjectMeta}, client.RawPatch(types.MergePatchType, body))
}

// The controller writes statuses after the counter, from a writer that
// may send one late (decided on an older fence record, or by a replica a
// pass behind). The API server keeps such a status from replacing a newer
// one: a final phase never changes, an issued fence never changes, and the
// counter generation a status was decided on never goes back while the
// fence stays; nor do a final grant's end and its signed record change.
func TestLateStatusNeverReplacesANewerOne(t *testing.T) {
	ns := namespace(t)
	a := mustAcquire(t, as(t, "a"), ns, 30)
	if a.Status.CounterGeneration == 0 {
		t.Fatalf("a Held status names no counter generation: %+v", a.Status)
	}

	wantReason(t, "a status decided on an older counter generation",
		statusPatch(t, a, map[string]any{"counterGeneration": a.Status.CounterGeneration - 1}), "FENCE_REGRESSION")
	wantReason(t, "a status with another fence",
		statusPatch(t, a, map[string]any{"fenceToken": a.Status.FenceToken + 1}), "FENCE_REGRESSION")
	// A writer that leaves the generation out (a merge patch with null
	// removes it) does not reset it.
	wantReason(t, "a status without its counter generation",
		statusPatch(t, a, map[string]any{"counterGeneration": nil}), "FENCE_REGRESSION")
	if a.Status.Record == nil {
		t.Fatalf("a Held status without its signed record: %+v", a.Status)
	}
	wantReason(t, "a status naming another owner in its record",
		statusPatch(t, a, map[string]any{"record": map[string]any{"owner": "mallory"}}), "FENCE_REGRESSION")
	wantReason(t, "a status without its record",
		statusPatch(t, a, map[string]any{"record": nil}), "FENCE_REGRESSION")
	if err := statusPatch(t, a, map[string]any{"counterGeneration": a.Status.CounterGeneration + 1}); err != nil {
		t.Fatalf("a status decided on a newer counter generation was refused: %v", err)
	}

	if err := release(t, as(t, "a"), a); err != nil {
		t.Fatal(err)
	}
	ended := waitPhase(t, a, lockingv1alpha1.PhaseReleased)
	wantReason(t, "a late Held over Released",
		statusPatch(t, ended, map[string]any{"phase": string(lockingv1alpha1.PhaseHeld), "counterGeneration": ended.Status.CounterGeneration + 10}), "ALREADY_ENDED")
	// A late copy of the same end, decided by a replica that came back
	// from a freeze, does not move when it ended: a successor granted in
	// between would read as overlapping it.
	later := metav1.NewMicroTime(ended.Status.EndedAt.Add(700 * time.Millisecond))
	wantReason(t, "a late end over an end",
		statusPatch(t, ended, map[string]any{"endedAt": later, "counterGeneration": ended.Status.CounterGeneration + 10}), "ALREADY_ENDED")
	wantReason(t, "a late lease end over an end",
		statusPatch(t, ended, map[string]any{"expiresAt": later}), "ALREADY_ENDED")
	if g := get(t, a); g.Status.Phase != lockingv1alpha1.PhaseReleased || g.Status.FenceToken != a.Status.FenceToken || !g.Status.EndedAt.Equal(ended.Status.EndedAt) {
		t.Fatalf("a is %s with fence %d after the refused writes; want Released with %d", g.Status.Phase, g.Status.FenceToken, a.Status.FenceToken)
	}
}
