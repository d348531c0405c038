//go:build linux

package plugin

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Commands that start processes outside their own process group, as
// daemons do. The one that leaves creates $DIR/up once it runs.
const (
	// setsidTree: a descendant in a session of its own (setsid).
	setsidTree = `setsid sh -c 'touch "$DIR/up"; while :; do date >> "$DIR/log"; sleep 1; done' & sleep 1000`
	// doubleForkTree: a grandchild whose parent exits at once, in a
	// process group of its own (fork, setpgid, fork).
	doubleForkTree = `( perl -e 'setpgrp(0, 0); open(F, ">", "$ENV{DIR}/up") and close(F); exec qw(sleep 1000) or die' & ) ; sleep 1000`
	// everyTree: both, under a command that ignores SIGTERM.
	everyTree = `trap '' TERM
setsid sh -c 'while :; do sleep 0.1; done' &
( perl -e 'setpgrp(0, 0); open(F, ">", "$ENV{DIR}/up") and close(F); exec qw(sleep 1000) or die' & )
sleep 1000`
)

// Nothing a `kubectl lockwarden run` command started runs past the loss of
// the lock plus the grace: not a descendant that called setsid, not a
// double-forked one in a process group of its own, and not when the plugin
// itself dies (SIGKILL, or SIGQUIT and the Go runtime's dump), where
// everything is killed at once, while the grant is still Held: before the
// lock can pass to anybody else.
func TestRunStopsEverythingTheCommandStarted(t *testing.T) {
	const grace = 2 * time.Second
	// settle is how much later than its deadline a process may end on a
	// loaded machine.
	const settle = 3 * time.Second
	for _, tc := range []struct {
		name   string
		script string
		// kill ends the plugin with this signal; 0: a forced release
		// ends the lock.
		kill syscall.Signal
	}{
		{"setsid descendant, forced release", setsidTree, 0},
		{"double fork, forced release", doubleForkTree, 0},
		{"plugin SIGKILL", everyTree, syscall.SIGKILL},
		{"plugin SIGQUIT", everyTree, syscall.SIGQUIT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			dir := t.TempDir()
			mark := "MARK=" + ns
			a := kubectlLock(t, "alice", []string{"DIR=" + dir, mark},
				"-n", ns, "run", "inv/13", "--ttl", "10s", "--grace", grace.String(), "--", "sh", "-c", tc.script)
			// Before the plugin's own clean-up, which waits for its output
			// pipes: kill whatever a failed run left holding them.
			t.Cleanup(func() {
				for _, pid := range marked(mark) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			eventually(t, 30*time.Second, "the command's descendant runs", func() bool { return fileHas(filepath.Join(dir, "up"), "") })
			var list lockingv1alpha1.LockGrantList
			if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
				t.Fatalf("listing the grant: %v (%d grants)", err, len(list.Items))
			}
			g := list.Items[0]
			t.Logf("running under the lock: %v", marked(mark))

			if tc.kill == 0 {
				if err := admin.Delete(t.Context(), &g); err != nil {
					t.Fatal(err)
				}
				lost := time.Now()
				eventually(t, grace+settle, "nothing the command started runs", func() bool {
					return len(marked(mark, a.cmd.Process.Pid)) == 0
				})
				t.Logf("everything gone %s after the forced release", time.Since(lost))
				if code := a.wait(t, 30*time.Second); code != 123 {
					t.Fatalf("run exited %d, want 123:\n%s", code, a.stderr)
				}
				return
			}
			if err := a.cmd.Process.Signal(tc.kill); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			eventually(t, settle, "nothing the command started runs", func() bool { return len(marked(mark)) == 0 })
			t.Logf("everything gone %s after the plugin got %s", time.Since(killed), tc.kill)
			if err := admin.Get(t.Context(), client.ObjectKeyFromObject(&g), &g); err != nil {
				t.Fatal(err)
			}
			if g.Status.Phase != lockingv1alpha1.PhaseHeld {
				t.Fatalf("the grant was %s by the time the command's processes were gone, want still Held", g.Status.Phase)
			}
		})
	}
}

// marked lists the live processes whose environment holds env (zombies
// have none), but for the pids in except.
func marked(env string, except ...int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || slices.Contains(except, pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && slices.ContainsFunc(bytes.Split(b, []byte{0}), func(v []byte) bool { return string(v) == env }) {
			out = append(out, pid)
		}
	}
	return out
}
