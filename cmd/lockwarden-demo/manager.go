package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// What config/local installs and the manager serves.
const (
	// defaultWebhookPort is where config/local points the API server.
	defaultWebhookPort   = 9443
	webhookCertSecret    = "lockwarden-system/lockwarden-webhook-server-cert"
	systemNamespace      = "lockwarden-system"
	mutatingConfigName   = "lockwarden-mutating-webhook-configuration"
	validatingConfigName = "lockwarden-validating-webhook-configuration"

	managerReadyTimeout = 60 * time.Second
	managerStopGrace    = 10 * time.Second
)

// managerProc is the lockwarden manager running as a child process.
type managerProc struct {
	cmd       *exec.Cmd
	logPath   string
	probeAddr string
	// exited is closed when the process has exited; err is then its exit
	// status.
	exited chan struct{}
	err    error
}

// startManager starts the manager against the admin kubeconfig, with its
// webhook server on localhost:webhookPort and its log in dir/manager.log. It
// fails at once if the port is taken.
func startManager(bin, kubeconfig, dir string, webhookPort int) (*managerProc, error) {
	if err := checkPortFree(webhookPort); err != nil {
		return nil, err
	}
	probePort, err := freePort()
	if err != nil {
		return nil, err
	}
	m := &managerProc{
		logPath:   filepath.Join(dir, "manager.log"),
		probeAddr: "127.0.0.1:" + strconv.Itoa(probePort),
		exited:    make(chan struct{}),
	}
	logFile, err := os.Create(m.logPath)
	if err != nil {
		return nil, err
	}
	m.cmd = exec.Command(bin,
		"--kubeconfig", kubeconfig,
		"--webhook-cert-secret="+webhookCertSecret,
		"--webhook-dns-name=localhost",
		"--webhook-port="+strconv.Itoa(webhookPort),
		"--metrics-bind-address=0",
		"--health-probe-bind-address="+m.probeAddr,
	)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	// Its own process group: a Ctrl-C in the terminal reaches the demo
	// only, which then stops the manager in order.
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		m.err = m.cmd.Wait()
		logFile.Close()
		close(m.exited)
	}()
	return m, nil
}

// waitReady waits until /readyz answers 200, both webhook configurations
// carry the manager's CA, and the LockGrant webhook itself answers: a grant
// naming another owner is refused with NOT_OWNER, rather than failing to
// reach the webhook.
func (m *managerProc) waitReady(ctx context.Context, c client.Client) error {
	var notYet string
	httpc := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, managerReadyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-m.exited:
			return false, fmt.Errorf("the manager exited (%v); last lines of %s:\n%s", m.err, m.logPath, tail(m.logPath, 15))
		default:
		}
		if notYet = m.readyz(ctx, httpc); notYet != "" {
			return false, nil
		}
		if notYet = caBundlesInjected(ctx, c); notYet != "" {
			return false, nil
		}
		notYet = probeWebhook(ctx, c)
		return notYet == "", nil
	})
	if err != nil && notYet != "" && ctx.Err() == nil {
		return fmt.Errorf("the manager was not ready after %s: %s (log: %s)", managerReadyTimeout, notYet, m.logPath)
	}
	return err
}

// readyz returns "" when the manager's /readyz answers 200, else why not.
func (m *managerProc) readyz(ctx context.Context, httpc *http.Client) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.probeAddr+"/readyz?verbose", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return "/readyz: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return "/readyz: " + resp.Status + ": " + strings.Join(strings.Fields(string(body)), " ")
	}
	return ""
}

// caBundlesInjected returns "" when every webhook of both configurations
// has a caBundle, else why not.
func caBundlesInjected(ctx context.Context, c client.Client) string {
	var mc admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: mutatingConfigName}, &mc); err != nil {
		return err.Error()
	}
	for _, w := range mc.Webhooks {
		if len(w.ClientConfig.CABundle) == 0 {
			return "no caBundle yet in webhook " + w.Name
		}
	}
	var vc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: validatingConfigName}, &vc); err != nil {
		return err.Error()
	}
	for _, w := range vc.Webhooks {
		if len(w.ClientConfig.CABundle) == 0 {
			return "no caBundle yet in webhook " + w.Name
		}
	}
	return ""
}

// probeWebhook creates a LockGrant whose owner is not the requester; it
// returns "" when admission refuses it with NOT_OWNER, else what happened
// (a TLS or connection error while the webhook is still coming up).
func probeWebhook(ctx context.Context, c client.Client) string {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "readiness-probe-", Namespace: systemNamespace},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             "lockwarden-demo/readiness-probe",
			Owner:                "system:serviceaccount:nowhere:nobody",
			LeaseDurationSeconds: 1,
		},
	}
	err := c.Create(ctx, g)
	switch {
	case err == nil:
		_ = c.Delete(ctx, g)
		return "the LockGrant webhook admitted a grant whose spec.owner is not the requester"
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "NOT_OWNER"):
		return ""
	}
	return "webhook probe: " + err.Error()
}

// stop asks the manager to shut down (SIGTERM) and kills it after a grace
// period.
func (m *managerProc) stop() {
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(managerStopGrace):
		fmt.Fprintf(os.Stderr, "warning: the manager did not stop within %s; killing it\n", managerStopGrace)
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
}

// checkPortFree fails with a clear message when something already listens
// on port, or the port cannot be bound.
func checkPortFree(port int) error {
	addr := net.JoinHostPort("localhost", strconv.Itoa(port))
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("port %d is already in use (another lockwarden manager, `make run`, or an earlier demo?): the webhook server needs it; stop that process and retry", port)
	}
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("port %d cannot be bound (%v): the webhook server needs it; free it and retry", port, err)
	}
	return l.Close()
}

// freePort returns a TCP port on 127.0.0.1 that nobody listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
