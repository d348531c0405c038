package plugin

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The plugin's subcommands and their documented exit codes, as a user sees
// them through `kubectl lock`.
func TestCommands(t *testing.T) {
	ns := namespace(t)
	const res = "cli/orders"

	code, out, errOut := kubectlLockOK(t, "alice", "-n", ns, "acquire", res, "--ttl", "60s", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire exited %d: %s", code, errOut)
	}
	var g lockingv1alpha1.LockGrant
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatalf("acquire -o json printed %q: %v", out, err)
	}
	if g.Kind != "LockGrant" || g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.FenceToken != 1 || g.Status.Proof == "" || g.Spec.Owner != "alice" {
		t.Fatalf("acquired grant: kind %q, %+v, owner %q", g.Kind, g.Status, g.Spec.Owner)
	}

	code, out, _ = kubectlLockOK(t, "bob", "-n", ns, "status", res)
	t.Logf("kubectl lock status %s:\n%s", res, out)
	for _, want := range []string{"Holder:", g.Name, "owner alice", "Fence:", "Queue:"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("status exited %d without %q:\n%s", code, want, out)
		}
	}
	code, out, _ = kubectlLockOK(t, "bob", "-n", ns, "list", "--resource", res, "--phase", "held")
	t.Logf("kubectl lock list:\n%s", out)
	if code != 0 || !strings.Contains(out, g.Name) || !strings.Contains(out, "Held") {
		t.Fatalf("list exited %d:\n%s", code, out)
	}
	// kubectl's output formats.
	if code, out, errOut = kubectlLockOK(t, "bob", "-n", ns, "status", res, "-o", "jsonpath={.holder.fence} {.holder.owner}"); code != 0 || out != "1 alice" {
		t.Fatalf("status -o jsonpath exited %d and printed %q: %s", code, out, errOut)
	}
	if code, out, errOut = kubectlLockOK(t, "bob", "-n", ns, "list", "-o", "name"); code != 0 || out != "lockgrant.locking.lockwarden.io/"+g.Name+"\n" {
		t.Fatalf("list -o name exited %d and printed %q: %s", code, out, errOut)
	}
	if code, out, errOut = kubectlLockOK(t, "bob", "-n", ns, "list", "-o", "go-template={{range .items}}{{.spec.resource}}{{end}}"); code != 0 || out != res {
		t.Fatalf("list -o go-template exited %d and printed %q: %s", code, out, errOut)
	}
	var gl lockingv1alpha1.LockGrantList
	if code, out, _ = kubectlLockOK(t, "bob", "-n", ns, "list", "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &gl) != nil || gl.Kind != "LockGrantList" || len(gl.Items) != 1 {
		t.Fatalf("list -o json exited %d and printed %q", code, out)
	}
	if code, _, errOut = kubectlLockOK(t, "bob", "-n", ns, "status", res, "-o", "name"); code != 1 || !strings.Contains(errOut, "allowed formats") {
		t.Fatalf("status -o name exited %d, want 1 and the allowed formats: %s", code, errOut)
	}
	if code, out, _ = kubectlLockOK(t, "bob", "-n", ns, "list", "--phase", "Released"); code != 0 || strings.Contains(out, g.Name) {
		t.Fatalf("list --phase Released exited %d:\n%s", code, out)
	}

	// Bob cannot get it within a second (124), nor renew or release
	// alice's grant (3, NOT_OWNER).
	if code, _, errOut = kubectlLockOK(t, "bob", "-n", ns, "acquire", res, "--wait", "1s"); code != 124 {
		t.Fatalf("acquire of a held lock with --wait 1s exited %d, want 124: %s", code, errOut)
	}
	if code, _, errOut = kubectlLockOK(t, "bob", "-n", ns, "renew", g.Name); code != 3 || !strings.Contains(errOut, "NOT_OWNER") {
		t.Fatalf("bob's renew exited %d, want 3 NOT_OWNER: %s", code, errOut)
	}
	if code, _, errOut = kubectlLockOK(t, "bob", "-n", ns, "release", g.Name); code != 3 || !strings.Contains(errOut, "NOT_OWNER") {
		t.Fatalf("bob's release exited %d, want 3 NOT_OWNER: %s", code, errOut)
	}

	if code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "renew", ns+"/"+g.Name); code != 0 || !strings.Contains(out, "fence 1") {
		t.Fatalf("alice's renew exited %d: %s %s", code, out, errOut)
	}
	if code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "release", g.Name); code != 0 || !strings.Contains(out, "released") {
		t.Fatalf("alice's release exited %d: %s %s", code, out, errOut)
	}
	if code, _, errOut = kubectlLockOK(t, "alice", "-n", ns, "release", g.Name); code != 3 || !strings.Contains(errOut, "ALREADY_ENDED") {
		t.Fatalf("second release exited %d, want 3 ALREADY_ENDED: %s", code, errOut)
	}

	// run: the command's environment and exit status.
	code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "run", res, "--", "sh", "-c",
		`echo "$LOCKWARDEN_RESOURCE $LOCKWARDEN_NAMESPACE $LOCKWARDEN_FENCE"; test -n "$LOCKWARDEN_GRANT" && test -n "$LOCKWARDEN_GRANT_UID"`)
	if want := res + " " + ns + " 2\n"; code != 0 || out != want {
		t.Fatalf("run printed %q and exited %d, want %q and 0: %s", out, code, want, errOut)
	}
	if code, _, _ = kubectlLockOK(t, "alice", "-n", ns, "run", res, "--", "sh", "-c", "exit 7"); code != 7 {
		t.Fatalf("run of a failing command exited %d, want the command's 7", code)
	}
	if code, _, _ = kubectlLockOK(t, "alice", "-n", ns, "run", res, "--", "/nonexistent/command"); code != 127 {
		t.Fatalf("run of a missing command exited %d, want 127", code)
	}
	if code, _, _ = kubectlLockOK(t, "alice", "-n", ns, "run", res, "extra"); code != 125 {
		t.Fatalf("run with a command but no -- exited %d, want 125", code)
	}
	// run without a command holds the lock until Ctrl-C, then releases it.
	held := kubectlLock(t, "alice", nil, "-n", ns, "run", res)
	eventually(t, 30*time.Second, "run without a command holds the lock", func() bool { return strings.Contains(held.stdout.String(), " fence ") })
	if code, _, errOut = kubectlLockOK(t, "bob", "-n", ns, "acquire", res, "--wait", "1s"); code != 124 {
		t.Fatalf("acquire while run holds the lock exited %d, want 124: %s", code, errOut)
	}
	if err := held.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := held.wait(t, 30*time.Second); code != 0 || held.stderr.String() != "" {
		t.Fatalf("run without a command exited %d after Ctrl-C, want 0 and a quiet stderr:\n%s", code, held.stderr)
	}
	if code, out, errOut = kubectlLockOK(t, "bob", "-n", ns, "run", res, "--", "sh", "-c", `printf %s "$LOCKWARDEN_PROOF" | cut -c1-5`); code != 0 || out != "lgv1.\n" {
		t.Fatalf("run after the holder's Ctrl-C exited %d and printed %q, want the proof in LOCKWARDEN_PROOF: %s", code, out, errOut)
	}
	if code, out, _ = kubectlLockOK(t, "alice", "completion", "bash"); code != 0 || !strings.Contains(out, "bash completion") {
		t.Fatalf("completion bash exited %d", code)
	}
}
