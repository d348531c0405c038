package plugin

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// The reproduction of a dead waiter: a `kubectl lock run` killed (SIGKILL)
// while it waits in the queue is never granted; the live waiter behind it
// holds within 2 s of the holder's release instead of a TTL later.
func TestRunDeadWaiterIsSkipped(t *testing.T) {
	ns := namespace(t)
	holder := kubectlLock(t, "alice", nil, "-n", ns, "run", "n9/r", "--ttl", "20s", "--", "sleep", "8")
	eventually(t, 30*time.Second, "alice holds", func() bool { return grantOf(t, ns, "alice", lockingv1alpha1.PhaseHeld) != nil })

	dead := kubectlLock(t, "bob", nil, "-n", ns, "run", "n9/r", "--ttl", "20s", "--wait", "5m", "--", "sleep", "1")
	eventually(t, 30*time.Second, "bob's first run waits in the queue", func() bool {
		return strings.Contains(dead.stderr.String(), "position 0 in the queue")
	})
	if err := syscall.Kill(dead.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	dead.wait(t, 10*time.Second)
	deadGrant := grantOf(t, ns, "bob", lockingv1alpha1.PhasePending)
	if deadGrant == nil || deadGrant.Spec.Session == nil {
		t.Fatalf("the killed waiter's request is %+v, want Pending with a session", deadGrant)
	}

	live := kubectlLock(t, "bob", nil, "-n", ns, "run", "n9/r", "--ttl", "20s", "--wait", "5m", "--", "true")
	if code := holder.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("alice's run exited %d\n%s", code, holder.stderr)
	}
	if code := live.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("bob's live run exited %d\n%s", code, live.stderr)
	}

	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	var released, granted time.Time
	for _, g := range list.Items {
		if g.Namespace != ns {
			continue
		}
		switch {
		case g.Spec.Owner == "alice":
			released = g.Status.EndedAt.Time
		case g.UID == deadGrant.UID:
			ready := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady)
			if g.Status.FenceToken != 0 || g.Status.Phase != lockingv1alpha1.PhaseReleased || ready == nil || ready.Reason != fencing.ReasonSessionExpired.ConditionReason() {
				t.Errorf("the killed waiter's request ended %s (%+v) with fence %d; want Released (SessionExpired) without a fence", g.Status.Phase, ready, g.Status.FenceToken)
			}
		default:
			if g.Status.FenceToken != 2 {
				t.Errorf("the live waiter got fence %d, want 2", g.Status.FenceToken)
			}
			granted = g.Status.GrantedAt.Time
		}
	}
	took := granted.Sub(released)
	t.Logf("the live waiter held %s after the holder's release", took)
	if released.IsZero() || granted.IsZero() || took > 2*time.Second {
		t.Fatalf("the live waiter held %s after the release (released %s, granted %s); want within 2 s", took, released, granted)
	}
}

// grantOf returns owner's grant in ns that is in phase p, or nil.
func grantOf(t *testing.T, ns, owner string, p lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
	t.Helper()
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if g := &list.Items[i]; g.Namespace == ns && g.Spec.Owner == owner && g.Status.Phase == p {
			return g
		}
	}
	return nil
}
