package plugin

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// Two `kubectl lock run` with one request ID, started a second apart (a
// retried cron job): the second is refused DRIVER_MISMATCH (exit code 3)
// and never runs its command; the first runs alone and ends normally.
func TestRunOneHolderPerRequestID(t *testing.T) {
	ns := namespace(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	env := []string{"LOG=" + log, "DIR=" + dir}
	args := []string{"-n", ns, "run", "b10/r2", "--ttl", "10s", "--wait", "30s", "--request-id", "nightly-job", "--", "sh", "-c", serialChild}

	a := kubectlLock(t, "alice", env, args...)
	eventually(t, 30*time.Second, "the first run's command starts", func() bool { return fileHas(log, "start 1") })
	b := kubectlLock(t, "alice", env, args...)
	if code := b.wait(t, 30*time.Second); code != 3 || !strings.Contains(b.stderr.String(), "DRIVER_MISMATCH") {
		t.Fatalf("the second run exited %d, want 3 with DRIVER_MISMATCH:\n%s", code, b.stderr)
	}
	touch(t, filepath.Join(dir, "go-1"))
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("the first run exited %d:\n%s", code, a.stderr)
	}
	if got := string(must(os.ReadFile(log))); got != "start 1\nend 1\n" {
		t.Fatalf("the commands ran as\n%s\nwant the first one alone", got)
	}
	// The request ID is spent now: a third run is told so.
	c := kubectlLock(t, "alice", env, args...)
	if code := c.wait(t, 30*time.Second); code != 3 || !strings.Contains(c.stderr.String(), "ALREADY_ENDED") {
		t.Fatalf("a run with a spent request ID exited %d, want 3 ALREADY_ENDED:\n%s", code, c.stderr)
	}
}

// aliveChild ignores SIGTERM and records the time, in nanoseconds since the
// epoch, every 50 ms until it is killed.
const aliveChild = `
trap '' TERM
while :; do date +%s%N > "$DIR/alive.tmp"; mv "$DIR/alive.tmp" "$DIR/alive"; sleep 0.05; done
`

// A `kubectl lock run` whose renewals stop getting through (the network to
// the API server drops everything) kills a child that ignores SIGTERM
// before the controller's expiry: the child's last sign of life is before
// the grant's expiresAt, with the default --grace capped to what the lease
// leaves.
func TestRunKillsInsideTheLease(t *testing.T) {
	ns := namespace(t)
	dir := t.TempDir()
	px := startProxy(t)
	kc := proxyKubeconfig(t, px, kubeconfigs["alice"])

	a := kubectlLockAt(t, kc, []string{"DIR=" + dir}, "-n", ns, "run", "b10/kill", "--ttl", "10s", "--", "sh", "-c", aliveChild)
	eventually(t, 30*time.Second, "the child runs", func() bool { return fileHas(filepath.Join(dir, "alive"), "") })
	var g lockingv1alpha1.LockGrant
	eventually(t, 30*time.Second, "a renew was confirmed", func() bool {
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
			return false
		}
		g = list.Items[0]
		return g.Status.ObservedRenewals >= 1
	})
	px.Partition()
	if code := a.wait(t, 40*time.Second); code != 123 {
		t.Fatalf("run exited %d, want 123:\n%s", code, a.stderr)
	}
	if !strings.Contains(a.stderr.String(), "SIGKILL after 2.3") {
		t.Errorf("run does not say the grace it used (2.3s for a 10s lease):\n%s", a.stderr)
	}
	b := must(os.ReadFile(filepath.Join(dir, "alive")))
	ns64, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("the child's last sign of life %q: %v", b, err)
	}
	last := time.Unix(0, ns64)
	// The grant as the controller left it: expired at expiresAt.
	eventually(t, 30*time.Second, "the grant expired", func() bool {
		if err := admin.Get(t.Context(), client.ObjectKeyFromObject(&g), &g); err != nil {
			return false
		}
		return g.Status.Phase == lockingv1alpha1.PhaseExpired
	})
	exp := g.Status.ExpiresAt.Time
	t.Logf("child last alive %s, lease expired %s: %s before", last.Format(time.RFC3339Nano), exp.Format(time.RFC3339Nano), exp.Sub(last))
	if !last.Before(exp) {
		t.Fatalf("the child was still running %s after the lease expired", last.Sub(exp))
	}
}

// A `kubectl lock run` cut off from the API server while its command runs
// (a partition: its lease renewals and its session renewals stop getting
// through): the command, which ignores SIGTERM, is dead at least 1 s before
// the registry can end the grant, whichever of the lease and the session
// ends it, and so before the next waiter's command starts. Its session is
// as long as its grace needs; with the default 5 s session the registry
// ended the grant for the lapsed session about 6 s after the last renewal,
// while the command had 4.5 s + its grace (4.7 s for a 20 s lease) to live.
// With a 10 s lease and a 2 s grace the SIGKILL once counted the grace
// from when the supervisor read the stop, and landed 0.74 to 0.97 s before
// the lease's end: it must land at the local deadline, a margin before it.
func TestRunKillsBeforeTheRegistryEndsTheGrant(t *testing.T) {
	for _, tc := range []struct{ name, ttl, grace string }{
		{name: "default grace", ttl: "20s"},
		{name: "short lease", ttl: "10s", grace: "2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			dir, next := t.TempDir(), t.TempDir()
			px := startProxy(t)
			kc := proxyKubeconfig(t, px, kubeconfigs["alice"])

			args := []string{"-n", ns, "run", "b10/cut", "--ttl", tc.ttl}
			if tc.grace != "" {
				args = append(args, "--grace", tc.grace)
			}
			a := kubectlLockAt(t, kc, []string{"DIR=" + dir}, append(args, "--", "sh", "-c", aliveChild)...)
			eventually(t, 30*time.Second, "the child runs", func() bool { return fileHas(filepath.Join(dir, "alive"), "") })
			b := startSuccessor(t, ns, "b10/cut", next)
			held := awaitHeldAndWaiting(t, ns)
			px.Partition()
			if code := a.wait(t, 60*time.Second); code != 123 {
				t.Fatalf("run exited %d, want 123:\n%s", code, a.stderr)
			}
			checkDeadBeforeSuccessor(t, ns, dir, next, b, held)
		})
	}
}

// A `kubectl lock run` whose own process is frozen (SIGSTOP) while its
// command runs renews nothing and stops nothing: its command, which
// ignores SIGTERM, is killed all the same at the local deadline, by the
// supervisor alone, at least 1 s before the registry can end the grant and
// before the next waiter is granted the lock. Woken up, the run says the
// lock was lost and exits 123.
func TestRunFrozenPluginKillsBeforeTheSuccessor(t *testing.T) {
	ns := namespace(t)
	dir, next := t.TempDir(), t.TempDir()
	a := kubectlLock(t, "alice", []string{"DIR=" + dir}, "-n", ns, "run", "b10/frozen", "--ttl", "10s", "--grace", "2s", "--", "sh", "-c", aliveChild)
	eventually(t, 30*time.Second, "the child runs", func() bool { return fileHas(filepath.Join(dir, "alive"), "") })
	b := startSuccessor(t, ns, "b10/frozen", next)
	held := awaitHeldAndWaiting(t, ns)
	// Freeze the plugin (kubectl exec'd into it), not its supervisor.
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	checkDeadBeforeSuccessor(t, ns, dir, next, b, held)
	if err := syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t, 30*time.Second); code != 123 || !strings.Contains(a.stderr.String(), "lost while the command ran") {
		t.Fatalf("the woken run exited %d, want 123 and that the lock was lost:\n%s", code, a.stderr)
	}
}

// startSuccessor starts bob's `kubectl lock run` on resource, which waits
// for the lock and writes the time it started to $DIR/started.
func startSuccessor(t *testing.T, ns, resource, dir string) *proc {
	t.Helper()
	return kubectlLock(t, "bob", []string{"DIR=" + dir}, "-n", ns, "run", resource, "--ttl", "20s", "--wait", "90s", "--",
		"sh", "-c", `date +%s%N > "$DIR/started"`)
}

// awaitHeldAndWaiting waits until ns has one Held grant and one Pending,
// and returns the Held one.
func awaitHeldAndWaiting(t *testing.T, ns string) lockingv1alpha1.LockGrant {
	t.Helper()
	var held lockingv1alpha1.LockGrant
	eventually(t, 30*time.Second, "the next run waits", func() bool {
		var list lockingv1alpha1.LockGrantList
		if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 2 {
			return false
		}
		waiting := 0
		for _, g := range list.Items {
			switch g.Status.Phase {
			case lockingv1alpha1.PhaseHeld:
				held = g
			case lockingv1alpha1.PhasePending:
				waiting++
			}
		}
		return held.Name != "" && waiting == 1
	})
	return held
}

// checkDeadBeforeSuccessor waits for the successor b to finish and checks
// that the child's last sign of life ($dir/alive) came at least 1 s before
// the registry could end the held grant (its lease's end, or its end if
// the session lapsed first), and before the successor's grant and command
// started.
func checkDeadBeforeSuccessor(t *testing.T, ns, dir, next string, b *proc, held lockingv1alpha1.LockGrant) {
	t.Helper()
	if code := b.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("the next run exited %d:\n%s", code, b.stderr)
	}
	last, started := unixNanoIn(t, filepath.Join(dir, "alive")), unixNanoIn(t, filepath.Join(next, "started"))
	g := waitFinal(t, client.ObjectKeyFromObject(&held))
	ended := g.Status.EndedAt.Time
	if g.Status.ExpiresAt != nil && g.Status.ExpiresAt.Before(g.Status.EndedAt) {
		ended = g.Status.ExpiresAt.Time
	}
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var granted time.Time
	for _, s := range list.Items {
		if s.UID != held.UID && s.Status.GrantedAt != nil {
			granted = s.Status.GrantedAt.Time
		}
	}
	t.Logf("child last alive %s; the registry could end the grant %s (%s, %s), %s later; the next grant %s later, its command %s later",
		last.Format(time.RFC3339Nano), ended.Format(time.RFC3339Nano), g.Status.Phase, readyReason(g), ended.Sub(last), granted.Sub(last), started.Sub(last))
	if margin := ended.Sub(last); margin < time.Second {
		t.Fatalf("the child was still running %s before the registry could end its grant (%s), want at least 1s", margin, readyReason(g))
	}
	if granted.IsZero() || !last.Before(granted) {
		t.Fatalf("the child was still running when the next holder was granted the lock (%s)", granted.Format(time.RFC3339Nano))
	}
	if !last.Before(started) {
		t.Fatalf("the child was still running %s after the next holder's command started", last.Sub(started))
	}
}

// unixNanoIn reads a time written by `date +%s%N` into the file at path.
func unixNanoIn(t *testing.T, path string) time.Time {
	t.Helper()
	b := must(os.ReadFile(path))
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q: %v", path, b, err)
	}
	return time.Unix(0, ns)
}

// waitFinal waits until the grant has ended and returns it.
func waitFinal(t *testing.T, key client.ObjectKey) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := &lockingv1alpha1.LockGrant{}
	eventually(t, 30*time.Second, "the grant ended", func() bool {
		return admin.Get(t.Context(), key, g) == nil && g.Status.Phase.Final() && g.Status.EndedAt != nil
	})
	return g
}

// readyReason is the reason of a grant's Ready condition.
func readyReason(g *lockingv1alpha1.LockGrant) string {
	if c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// --grace that cannot fit in the lease is refused before anything is
// acquired.
func TestRunRefusesAGraceThatDoesNotFit(t *testing.T) {
	ns := namespace(t)
	code, _, errOut := kubectlLockOK(t, "alice", "-n", ns, "run", "b10/grace", "--ttl", "10s", "--grace", "10s", "--", "true")
	if code != 125 || !strings.Contains(errOut, "does not fit") {
		t.Fatalf("run --ttl 10s --grace 10s exited %d, want 125 and why:\n%s", code, errOut)
	}
	var list lockingv1alpha1.LockGrantList
	if err := admin.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Fatalf("a refused run made %d grants (%v)", len(list.Items), err)
	}
}

// renew and release of a grant that does not exist answer alike.
func TestRenewReleaseNonexistentAgree(t *testing.T) {
	ns := namespace(t)
	for _, verb := range []string{"renew", "release"} {
		code, _, errOut := kubectlLockOK(t, "alice", "-n", ns, verb, "nonexistent")
		if code != 3 || !strings.HasPrefix(strings.TrimPrefix(errOut, "kubectl-lockwarden: "), "grant "+ns+"/nonexistent: UNKNOWN_GRANT: ") {
			t.Errorf("%s nonexistent exited %d, want 3 and UNKNOWN_GRANT:\n%s", verb, code, errOut)
		}
	}
}

// A normal minute-long `kubectl lock run` prints nothing on stderr: no
// logger warnings, no stack traces.
func TestRunNoNoise(t *testing.T) {
	ns := namespace(t)
	code, out, errOut := kubectlLockOK60(t, "alice", "-n", ns, "run", "b10/quiet", "--ttl", "10s", "--", "sleep", "60")
	if code != 0 || errOut != "" || out != "" {
		t.Fatalf("a quiet run exited %d with stdout %q and stderr:\n%s", code, out, errOut)
	}
}

// kubectlLockOK60 is kubectlLockOK for a command that runs a minute.
func kubectlLockOK60(t *testing.T, user string, args ...string) (int, string, string) {
	t.Helper()
	p := kubectlLock(t, user, nil, args...)
	code := p.wait(t, 120*time.Second)
	return code, p.stdout.String(), p.stderr.String()
}

// kubectlLockAt starts `kubectl lock ARGS` with kubeconfig kc.
func kubectlLockAt(t *testing.T, kc string, env []string, args ...string) *proc {
	t.Helper()
	return kubectlLock(t, "", append([]string{"KUBECONFIG=" + kc}, env...), args...)
}

// startProxy starts a partitionable proxy to the API server.
func startProxy(t *testing.T) *envtest.Proxy {
	t.Helper()
	u, err := url.Parse(adminHost)
	if err != nil {
		t.Fatal(err)
	}
	p, err := envtest.StartProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// proxyKubeconfig writes a copy of the kubeconfig at path whose server is
// the proxy, and returns its path.
func proxyKubeconfig(t *testing.T, p *envtest.Proxy, path string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + p.Addr()
	}
	out := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}
