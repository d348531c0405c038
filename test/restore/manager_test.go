package restore

import (
	"bufio"
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
	webhookCertSecret    = "lockwarden-system/lockwarden-webhook-server-cert"
	systemNamespace      = "lockwarden-system"
	mutatingConfigName   = "lockwarden-mutating-webhook-configuration"
	validatingConfigName = "lockwarden-validating-webhook-configuration"

	managerReadyTimeout = 90 * time.Second
	managerStopGrace    = 10 * time.Second
)

// managerProc is the manager binary running as a child process, as `make
// run` runs it, with its metrics served on a loopback port.
type managerProc struct {
	cmd         *exec.Cmd
	logPath     string
	probeAddr   string
	metricsAddr string
	// exited is closed when the process has exited; err is then its exit
	// status.
	exited chan struct{}
	err    error
}

// startManager starts the manager against the admin kubeconfig, with its
// webhook server on webhookPort.
func startManager(bin, kubeconfig, dir string, webhookPort int) (*managerProc, error) {
	probePort, err := freePort()
	if err != nil {
		return nil, err
	}
	metricsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	m := &managerProc{
		logPath:     filepath.Join(dir, "manager.log"),
		probeAddr:   "127.0.0.1:" + strconv.Itoa(probePort),
		metricsAddr: "127.0.0.1:" + strconv.Itoa(metricsPort),
		exited:      make(chan struct{}),
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
		"--metrics-bind-address="+m.metricsAddr,
		"--health-probe-bind-address="+m.probeAddr,
	)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	// Its own process group, and killed with the test binary if that dies
	// without stopping it.
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
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

// running returns nil while the process runs, else how it ended.
func (m *managerProc) running() error {
	select {
	case <-m.exited:
		return fmt.Errorf("the manager exited (%v); last lines of %s:\n%s", m.err, m.logPath, tail(m.logPath, 20))
	default:
		return nil
	}
}

// waitReady waits until /readyz answers 200, both webhook configurations
// carry the manager's CA, and the LockGrant webhook answers: a grant naming
// another owner is refused with NOT_OWNER.
func (m *managerProc) waitReady(ctx context.Context, c client.Client) error {
	var notYet string
	httpc := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, managerReadyTimeout, true, func(ctx context.Context) (bool, error) {
		if err := m.running(); err != nil {
			return false, err
		}
		if notYet = m.get(ctx, httpc, m.probeAddr, "/readyz"); notYet != "" {
			return false, nil
		}
		if notYet = caBundlesInjected(ctx, c); notYet != "" {
			return false, nil
		}
		notYet = probeWebhook(ctx, c)
		return notYet == "", nil
	})
	if err != nil && notYet != "" {
		return fmt.Errorf("the manager was not ready after %s: %s (log: %s)", managerReadyTimeout, notYet, m.logPath)
	}
	return err
}

// get returns "" when GET http://addr+path answers 200, else why not.
func (m *managerProc) get(ctx context.Context, httpc *http.Client, addr, path string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return path + ": " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return path + ": " + resp.Status + ": " + oneLine(string(body))
	}
	return ""
}

// metric scrapes the manager's /metrics and returns the value of the
// series name{labels} (labels as in the exposition, e.g.
// `reason="FENCE_REGRESSION"`), 0 when the series is absent, and the
// scraped lines of that metric, for messages and docs.
func (m *managerProc) metric(ctx context.Context, name, labels string) (float64, []string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.metricsAddr+"/metrics", nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var value float64
	var lines []string
	series := name + "{" + labels + "}"
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		lines = append(lines, line)
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			if value, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
				return 0, lines, fmt.Errorf("parsing %q: %w", line, err)
			}
		}
	}
	return value, lines, sc.Err()
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
// returns "" when admission refuses it with NOT_OWNER, else what happened.
func probeWebhook(ctx context.Context, c client.Client) string {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "readiness-probe-", Namespace: systemNamespace},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             "lockwarden-restore/readiness-probe",
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
	if m.running() != nil {
		return
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

// freePort returns a TCP port on 127.0.0.1 that nobody listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
