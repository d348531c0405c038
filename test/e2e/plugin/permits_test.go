package plugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// permitChild logs its start with its permit, fenced resource, fence and
// grant; detects a second command in the same permit with a directory
// only one may hold; writes the guarded ConfigMap of its permit, bound to
// the permit's fenced resource ID; and waits for the test's go-ahead
// ($DIR/go-$LOCKWARDEN_GRANT).
const permitChild = `
echo "start $LOCKWARDEN_PERMIT $LOCKWARDEN_FENCED_RESOURCE $LOCKWARDEN_FENCE $LOCKWARDEN_GRANT" >> "$LOG"
mkdir "$DIR/permit-$LOCKWARDEN_PERMIT" || { echo "overlap $LOCKWARDEN_PERMIT" >> "$LOG"; exit 9; }
if kubectl apply -f - >/dev/null 2>"$DIR/err-$LOCKWARDEN_GRANT" <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: permit-$LOCKWARDEN_PERMIT
  namespace: $LOCKWARDEN_NAMESPACE
  labels:
    locking.lockwarden.io/guarded: "true"
  annotations:
    locking.lockwarden.io/resource: "$LOCKWARDEN_FENCED_RESOURCE"
    locking.lockwarden.io/grant: "$LOCKWARDEN_NAMESPACE/$LOCKWARDEN_GRANT"
    locking.lockwarden.io/fence: "$LOCKWARDEN_FENCE"
data:
  grant: "$LOCKWARDEN_GRANT"
EOF
then echo "wrote $LOCKWARDEN_PERMIT $LOCKWARDEN_GRANT" >> "$LOG"
else echo "refused $LOCKWARDEN_PERMIT $(head -c 300 "$DIR/err-$LOCKWARDEN_GRANT")" >> "$LOG"
fi
i=0
while [ ! -e "$DIR/go-$LOCKWARDEN_GRANT" ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
rmdir "$DIR/permit-$LOCKWARDEN_PERMIT"
echo "end $LOCKWARDEN_PERMIT $LOCKWARDEN_GRANT" >> "$LOG"
`

// permitStart is one "start" line of permitChild's log.
type permitStart struct {
	permit, fenced, fence, grant string
}

// permitLog reads permitChild's log: its start lines, and every line.
func permitLog(path string) ([]permitStart, []string) {
	b, _ := os.ReadFile(path)
	var starts []permitStart
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 5 && f[0] == "start" {
			starts = append(starts, permitStart{permit: f[1], fenced: f[2], fence: f[3], grant: f[4]})
		}
	}
	return starts, lines
}

// countPrefix counts the lines that start with prefix.
func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// Three `kubectl lock run --permits 2` on one resource: two commands run at
// once, each in its own permit with its own fenced resource and guarded
// object; the third waits in the queue until one ends, and then runs in the
// permit that was freed, with that permit's next fence. status shows the
// limit, both holders and the waiter.
func TestRunPermits(t *testing.T) {
	ns := namespace(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	env := []string{"LOG=" + log, "DIR=" + dir}
	const res = "farm/render"

	var runs []*proc
	for _, user := range []string{"alice", "bob", "alice"} {
		runs = append(runs, kubectlLock(t, user, env, "-n", ns, "run", res, "--permits", "2", "--ttl", "20s", "--wait", "120s", "--", "sh", "-c", permitChild))
	}
	eventually(t, 60*time.Second, "two commands run", func() bool { s, _ := permitLog(log); return len(s) == 2 })
	var waiter *proc
	// The progress line counts the holders when the waiter's own request
	// last changed: the second holder's Held status may land after it
	// (status reports both holders below).
	waiting := regexp.MustCompile(`waiting for ` + regexp.QuoteMeta(res) + `: position 0 in the queue, [12] of 2 permits held`)
	eventually(t, 60*time.Second, "the third run waits in the queue", func() bool {
		for _, p := range runs {
			if waiting.MatchString(p.stderr.String()) {
				waiter = p
				return true
			}
		}
		return false
	})
	eventually(t, 60*time.Second, "both commands wrote their permit's object", func() bool {
		_, lines := permitLog(log)
		return countPrefix(lines, "wrote ")+countPrefix(lines, "refused ") == 2
	})
	starts, lines := permitLog(log)
	if len(starts) != 2 || countPrefix(lines, "wrote ") != 2 {
		t.Fatalf("while one run waits: %d commands started, want 2 that wrote their object:\n%s", len(starts), strings.Join(lines, "\n"))
	}
	for _, s := range starts {
		want := map[string]string{"0": res, "1": res + "#1"}[s.permit]
		if want == "" || s.fenced != want || s.fence != "1" {
			t.Fatalf("a command got permit %q, fenced resource %q, fence %s; want permit 0 or 1 with its own fenced resource and fence 1", s.permit, s.fenced, s.fence)
		}
	}
	if starts[0].permit == starts[1].permit {
		t.Fatalf("both commands got permit %s", starts[0].permit)
	}

	code, out, errOut := kubectlLockOK(t, "bob", "-n", ns, "status", res)
	t.Logf("kubectl lock status %s:\n%s", res, out)
	for _, want := range []string{"Permits:", "2 (2 held)", res + "#1", starts[0].grant, starts[1].grant, "Queue:", "1 waiting"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("status exited %d without %q:\n%s%s", code, want, out, errOut)
		}
	}
	var st struct {
		Permits int32 `json:"permits"`
		Holders []struct {
			Permit int32 `json:"permit"`
			Fence  int64 `json:"fence"`
		} `json:"holders"`
		Queue []struct {
			Position int32 `json:"position"`
		} `json:"queue"`
	}
	if code, out, errOut = kubectlLockOK(t, "bob", "-n", ns, "status", res, "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status -o json exited %d and printed %q: %s", code, out, errOut)
	}
	if st.Permits != 2 || len(st.Holders) != 2 || st.Holders[0].Permit != 0 || st.Holders[1].Permit != 1 || st.Holders[0].Fence != 1 || st.Holders[1].Fence != 1 || len(st.Queue) != 1 {
		t.Fatalf("status -o json: %+v; want 2 permits held, permits 0 and 1 at fence 1, one waiting", st)
	}

	// The first command ends: its permit goes to the waiter, with the
	// permit's next fence.
	freed, kept := starts[0], starts[1]
	touch(t, filepath.Join(dir, "go-"+freed.grant))
	eventually(t, 60*time.Second, "the waiting run's command starts", func() bool { s, _ := permitLog(log); return len(s) == 3 })
	starts, _ = permitLog(log)
	third := starts[2]
	if third.permit != freed.permit || third.fenced != freed.fenced || third.fence != "2" {
		t.Fatalf("the third command got permit %s (%s) fence %s; want the freed permit %s (%s) at fence 2", third.permit, third.fenced, third.fence, freed.permit, freed.fenced)
	}
	eventually(t, 60*time.Second, "the third command wrote its permit's object", func() bool {
		_, lines := permitLog(log)
		return countPrefix(lines, "wrote ")+countPrefix(lines, "refused ") == 3
	})
	touch(t, filepath.Join(dir, "go-"+kept.grant))
	touch(t, filepath.Join(dir, "go-"+third.grant))
	for _, p := range runs {
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("%v exited %d\n%s", p.cmd.Args, code, p.stderr)
		}
	}
	if !strings.Contains(waiter.stderr.String(), "acquired "+res+": grant "+third.grant+", permit "+third.permit+" ("+third.fenced+"), fence 2") {
		t.Errorf("the waiter's stderr does not name its permit:\n%s", waiter.stderr)
	}

	// The log never shows two commands in one permit, more than two at
	// once, or a refused write.
	_, lines = permitLog(log)
	t.Logf("log:\n%s", strings.Join(lines, "\n"))
	running := 0
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "start "):
			running++
		case strings.HasPrefix(l, "end "):
			running--
		case strings.HasPrefix(l, "overlap "), strings.HasPrefix(l, "refused "):
			t.Fatalf("%s", l)
		}
		if running > 2 {
			t.Fatalf("more than 2 commands ran at once")
		}
	}
	// Each permit's guarded object is bound to the permit's fenced resource
	// and accepted that permit's fences: the freed permit's object the
	// second holder's fence 2.
	for _, s := range []permitStart{kept, third} {
		var cm corev1.ConfigMap
		if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "permit-" + s.permit}, &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Annotations[lockingv1alpha1.ResourceAnnotation] != s.fenced || cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != s.fence || cm.Data["grant"] != s.grant {
			t.Errorf("object of permit %s: resource %q, accepted fence %q, written by %q; want %q, %s, %s", s.permit,
				cm.Annotations[lockingv1alpha1.ResourceAnnotation], cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation], cm.Data["grant"], s.fenced, s.fence, s.grant)
		}
	}
}
