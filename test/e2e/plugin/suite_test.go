package plugin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

// The manager's --finished-grant-retention and --request-id-window: short
// enough for a test to see a finished grant deleted and its request ID's
// window pass, long enough for every test to read the grants it ends.
const (
	retention       = 20 * time.Second
	requestIDWindow = 40 * time.Second
)

var (
	admin client.Client
	// binDir holds the freshly built kubectl-lock and a link to bin/kubectl:
	// the PATH of every command the tests run.
	binDir string
	// kubeconfigs of the users the tests act as, by name.
	kubeconfigs = map[string]string{}
	// adminHost is the API server's URL.
	adminHost string
)

func TestMain(m *testing.M) {
	envtest.Main(m, envtest.Suite{
		// Finished grants are deleted after a few seconds and their
		// request IDs stay spent for a few more, so that a test sees both
		// happen.
		Options: envtest.Options{FinishedGrantRetention: retention, RequestIDWindow: requestIDWindow},
		Setup:   setup,
	})
}

// setup builds the plugin, lets users work with grants and keep sessions,
// and writes the kubeconfigs of the users the tests act as.
func setup(ctx context.Context, e *envtest.Env) error {
	admin = e.Admin
	adminHost = e.Config.Host
	dir, err := os.MkdirTemp("", "lockwarden-e2e-")
	if err != nil {
		return err
	}
	e.Cleanup(func() { os.RemoveAll(dir) })
	binDir = filepath.Join(dir, "bin")
	if err := buildPlugin(e.Root, os.Getenv("KUBEBUILDER_ASSETS")); err != nil {
		return err
	}
	if err := e.GrantUsersAccess(ctx); err != nil {
		return err
	}
	// kubectl lock run keeps a session, as it would in a real cluster.
	if err := e.GrantUsersSessions(ctx, ""); err != nil {
		return err
	}
	for _, name := range []string{"alice", "bob"} {
		u, err := e.Env.AddUser(crenvtest.User{Name: name, Groups: []string{"system:authenticated"}}, nil)
		if err != nil {
			return err
		}
		kc, err := u.KubeConfig()
		if err != nil {
			return err
		}
		kubeconfigs[name] = filepath.Join(dir, name+".kubeconfig")
		if err := os.WriteFile(kubeconfigs[name], kc, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// buildPlugin builds cmd/kubectl-lock into binDir and links kubectl there,
// so that `kubectl lock` finds the plugin on PATH as a user's shell would.
func buildPlugin(root, assets string) error {
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-o", filepath.Join(binDir, "kubectl-lock"), "./cmd/kubectl-lock")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building kubectl-lock: %w\n%s", err, out)
	}
	return os.Symlink(filepath.Join(assets, "kubectl"), filepath.Join(binDir, "kubectl"))
}

// namespace creates a fresh namespace for one test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := admin.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// syncBuffer is a bytes.Buffer safe to read while a process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a `kubectl lock` process started by a test.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	exited         chan struct{}
	code           int
}

// kubectlLock starts `kubectl lock ARGS` as user, with extra environment
// variables, through kubectl's plugin mechanism.
func kubectlLock(t *testing.T, user string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"lock"}, args...)...)
	p.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfigs[user], "PATH="+binDir+":"+os.Getenv("PATH"))
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(within):
		t.Fatalf("%v did not exit within %s\nstdout:\n%s\nstderr:\n%s", p.cmd.Args, within, p.stdout, p.stderr)
		return -1
	}
}

// kubectlLockOK runs `kubectl lock ARGS` to completion and returns its exit
// code, stdout and stderr.
func kubectlLockOK(t *testing.T, user string, args ...string) (int, string, string) {
	t.Helper()
	p := kubectlLock(t, user, nil, args...)
	code := p.wait(t, 60*time.Second)
	return code, p.stdout.String(), p.stderr.String()
}

// eventually polls cond every 20 ms until it holds, failing after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, within, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("never: %s", what)
	}
}

// fileHas reports whether the file at path contains s.
func fileHas(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}
