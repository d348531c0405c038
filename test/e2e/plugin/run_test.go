package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// serialChild records its start and end in $LOG, detects an overlap with a
// directory only one command may hold, and waits for the test's go-ahead
// ($DIR/go-$LOCKWARDEN_FENCE) so that the two runs have every chance to
// overlap if the lock let them.
const serialChild = `
echo "start $LOCKWARDEN_FENCE" >> "$LOG"
mkdir "$DIR/inside" || { echo "overlap $LOCKWARDEN_FENCE" >> "$LOG"; exit 9; }
i=0
while [ ! -e "$DIR/go-$LOCKWARDEN_FENCE" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
rmdir "$DIR/inside"
echo "end $LOCKWARDEN_FENCE" >> "$LOG"
`

// Two `kubectl lock run` on one resource run their commands one after the
// other, never overlapping; the second waits in the queue with a progress
// line, and gets the next fence.
func TestRunSerializes(t *testing.T) {
	ns := namespace(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	env := []string{"LOG=" + log, "DIR=" + dir}

	a := kubectlLock(t, "alice", env, "-n", ns, "run", "reports/nightly", "--ttl", "5s", "--", "sh", "-c", serialChild)
	eventually(t, 30*time.Second, "alice's command starts", func() bool { return fileHas(log, "start 1") })
	b := kubectlLock(t, "bob", env, "-n", ns, "run", "reports/nightly", "--ttl", "5s", "--wait", "60s", "--", "sh", "-c", serialChild)
	eventually(t, 30*time.Second, "bob waits in the queue", func() bool {
		return strings.Contains(b.stderr.String(), "waiting for reports/nightly: position 0 in the queue")
	})
	if !strings.Contains(b.stderr.String(), "held by") || !strings.Contains(b.stderr.String(), "alice") {
		t.Errorf("bob's progress line does not name the holder:\n%s", b.stderr)
	}
	// Alice's command has been running for a while with bob waiting: let it
	// finish once a renewal was needed (TTL 5 s, renew every 1.7 s). Not
	// later: bob's client counts its lease from its request's send time (it
	// cannot know when it was granted), so the longer bob waits, the sooner
	// its first renew must be confirmed, and a loaded machine may not
	// confirm it in time.
	eventually(t, 30*time.Second, "alice's grant was renewed", func() bool {
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list); err != nil {
			return false
		}
		for _, g := range list.Items {
			if g.Namespace == ns && g.Spec.Owner == "alice" && g.Status.ObservedRenewals >= 1 {
				return true
			}
		}
		return false
	})
	touch(t, filepath.Join(dir, "go-1"))
	eventually(t, 30*time.Second, "bob's command starts", func() bool { return fileHas(log, "start 2") })
	touch(t, filepath.Join(dir, "go-2"))
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("alice's run exited %d\n%s", code, a.stderr)
	}
	if code := b.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("bob's run exited %d\n%s", code, b.stderr)
	}
	got, _ := os.ReadFile(log)
	if want := "start 1\nend 1\nstart 2\nend 2\n"; string(got) != want {
		t.Fatalf("the commands ran as\n%s\nwant one after the other:\n%s", got, want)
	}
	if !strings.Contains(b.stderr.String(), "acquired reports/nightly") {
		t.Errorf("bob's stderr does not say it acquired the lock:\n%s", b.stderr)
	}
}

// writerChild makes a guarded write of ConfigMap "shared" under its lock
// every 0.2 s until it is stopped, logging each answer; on SIGTERM it logs
// that it was terminated.
const writerChild = `
trap 'echo terminated >> "$LOG"; exit 143' TERM
n=0
while :; do
  n=$((n+1))
  if kubectl apply -f - >/dev/null 2>"$DIR/err" <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: shared
  namespace: $LOCKWARDEN_NAMESPACE
  labels:
    locking.lockwarden.io/guarded: "true"
  annotations:
    locking.lockwarden.io/resource: "$LOCKWARDEN_RESOURCE"
    locking.lockwarden.io/grant: "$LOCKWARDEN_NAMESPACE/$LOCKWARDEN_GRANT"
    locking.lockwarden.io/fence: "$LOCKWARDEN_FENCE"
data:
  writer: "$WRITER"
  count: "$n"
EOF
  then echo "ok $n" >> "$LOG"
  else echo "refused $n $(grep -oE '(STALE_OWNER|EXPIRED|NOT_OWNER|ALREADY_ENDED|NOT_HELD|UNKNOWN_GRANT|BINDING_MISMATCH|NO_FENCE|BAD_SIGNATURE|FENCE_REGRESSION): .*' "$DIR/err" | head -1 | cut -c1-160)" >> "$LOG"
  fi
  [ -n "$ONCE" ] && exit 0
  sleep 0.2
done
`

// A `kubectl lock run` whose holder process is frozen past its TTL
// (SIGSTOP): its command is stopped at the local deadline all the same (by
// the supervisor, which the frozen plugin no longer tells that the
// deadline moved), the successor gets a higher fence and its write stands,
// and when the holder wakes it says the lock was lost and exits 123.
func TestRunFrozenHolder(t *testing.T) {
	ns := namespace(t)
	dirA, dirB := t.TempDir(), t.TempDir()
	logA, logB := filepath.Join(dirA, "log"), filepath.Join(dirB, "log")

	a := kubectlLock(t, "alice", []string{"LOG=" + logA, "DIR=" + dirA, "WRITER=alice"},
		"-n", ns, "run", "ledger/shared", "--ttl", "6s", "--grace", "1s", "--", "sh", "-c", writerChild)
	eventually(t, 30*time.Second, "alice's command writes under the lock", func() bool { return fileHas(logA, "ok 1") })

	// Freeze the holder (the plugin process; kubectl exec'd into it).
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()

	b := kubectlLock(t, "bob", []string{"LOG=" + logB, "DIR=" + dirB, "WRITER=bob", "ONCE=1"},
		"-n", ns, "run", "ledger/shared", "--ttl", "10s", "--wait", "60s", "--", "sh", "-c", writerChild)
	if code := b.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("bob's run exited %d\n%s", code, b.stderr)
	}
	if !fileHas(logB, "ok 1") {
		b, _ := os.ReadFile(logB)
		t.Fatalf("bob's write was not accepted: %s", b)
	}
	if took := time.Since(frozen); took < 3*time.Second {
		t.Fatalf("bob got the lock %s after alice froze, before alice's 6 s lease could have run out", took)
	}
	// Alice's command was stopped at her deadline, before bob was granted
	// the lock: SIGTERM, which it handles by exiting.
	if !fileHas(logA, "terminated") {
		t.Errorf("alice's command was not sent SIGTERM while its plugin was frozen; its log:\n%s", must(os.ReadFile(logA)))
	}

	// Wake the holder: it notices that its lease is over.
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t, 30*time.Second); code != 123 {
		t.Fatalf("alice's run exited %d, want 123 (lock lost)\n%s", code, a.stderr)
	}

	var cm corev1.ConfigMap
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "shared"}, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Data["writer"] != "bob" || cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != "2" {
		t.Fatalf("the guarded object is %q at fence %s; want bob's write at fence 2", cm.Data["writer"], cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation])
	}
	logText := string(must(os.ReadFile(logA)))
	t.Logf("alice's command log:\n%s", logText)
	if strings.Contains(logText, "refused") {
		t.Errorf("alice's command still wrote after her lease ended:\n%s", logText)
	}
	if !strings.Contains(a.stderr.String(), "lost while the command ran") {
		t.Errorf("alice's stderr does not say the lock was lost:\n%s", a.stderr)
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		return []byte(err.Error())
	}
	return b
}
