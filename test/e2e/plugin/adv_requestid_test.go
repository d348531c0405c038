package plugin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// kubectlAs runs plain kubectl ARGS as user and returns its combined output.
func kubectlAs(t *testing.T, user string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfigs[user])
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The owner's delete of its grant right after `run` released it (the
// weakest means there is: `kubectl delete lockgrant`, allowed because the
// grant has ended) must not forget the request ID: the ID was spent when
// the grant ended, and a retried run within the window is refused
// ALREADY_ENDED and does not run its command again, as it is when the
// controller deletes the grant after its retention.
func TestRequestIDStaysSpentWhenItsEndedGrantIsDeletedAtOnce(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const res, id = "inv/5r", "nightly-2026-12-05"
	run := func(what string) (int, string, string) {
		return kubectlLockOK(t, "alice", "-n", ns, "run", res, "--request-id", id, "--ttl", "10s", "--", "sh", "-c", "echo "+what)
	}
	if code, out, errOut := run("first"); code != 0 || out != "first\n" {
		t.Fatalf("the first run exited %d and printed %q: %s", code, out, errOut)
	}
	name := lockingv1alpha1.GrantNameForRequest(id)
	if out, err := kubectlAs(t, "alice", "-n", ns, "delete", "lockgrant", name); err != nil && !strings.Contains(out, "REQUEST_ID") {
		t.Fatalf("kubectl delete lockgrant %s: %v: %s", name, err, out)
	}
	if code, out, errOut := run("AGAIN"); code != 3 || out != "" || !strings.Contains(errOut, "ALREADY_ENDED") {
		t.Fatalf("a retry after the owner deleted the ended grant at once exited %d and printed %q (the command ran again), want 3 ALREADY_ENDED: %s", code, out, errOut)
	}
}
