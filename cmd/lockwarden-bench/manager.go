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

// managerProc is the lockwarden manager running as a child process.
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
// webhook server on 127.0.0.1:webhookPort, plain-HTTP metrics and probes on
// free ports of 127.0.0.1, the given finished-grant retention, and its log in
// logPath.
func startManager(bin, kubeconfig, logPath string, webhookPort int, retention time.Duration) (*managerProc, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	m := &managerProc{
		logPath:     logPath,
		probeAddr:   "127.0.0.1:" + strconv.Itoa(ports[0]),
		metricsAddr: "127.0.0.1:" + strconv.Itoa(ports[1]),
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
		"--webhook-host=127.0.0.1",
		"--webhook-port="+strconv.Itoa(webhookPort),
		"--metrics-bind-address="+m.metricsAddr,
		"--health-probe-bind-address="+m.probeAddr,
		"--finished-grant-retention="+retention.String(),
	)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	// Its own process group: a Ctrl-C in the terminal reaches the bench
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
// naming another owner is refused with NOT_OWNER.
func (m *managerProc) waitReady(ctx context.Context, c client.Client) error {
	var notYet string
	httpc := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, managerReadyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-m.exited:
			return false, fmt.Errorf("the manager exited (%v); last lines of %s:\n%s", m.err, m.logPath, tail(m.logPath, 15))
		default:
		}
		if notYet = httpGet(ctx, httpc, "http://"+m.probeAddr+"/readyz", nil); notYet != "" {
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

// metrics returns the manager's Prometheus metrics, as text.
func (m *managerProc) metrics(ctx context.Context) (string, error) {
	var body bytes.Buffer
	if e := httpGet(ctx, &http.Client{Timeout: 5 * time.Second}, "http://"+m.metricsAddr+"/metrics", &body); e != "" {
		return "", fmt.Errorf("scraping the manager's metrics: %s", e)
	}
	return body.String(), nil
}

// memory returns the manager's resident set size and its peak, in bytes,
// from /proc/<pid>/status (VmRSS, VmHWM).
func (m *managerProc) memory() (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb * 1024
		case "VmHWM:":
			peak = kb * 1024
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", m.cmd.Process.Pid)
	}
	return rss, peak, nil
}

// httpGet returns "" when url answers 200 (its body copied to body, when
// given), else why not.
func httpGet(ctx context.Context, httpc *http.Client, url string, body io.Writer) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return url + ": " + resp.Status + ": " + strings.Join(strings.Fields(string(b)), " ")
	}
	if body != nil {
		if _, err := io.Copy(body, resp.Body); err != nil {
			return err.Error()
		}
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
// returns "" when admission refuses it with NOT_OWNER, else what happened.
func probeWebhook(ctx context.Context, c client.Client) string {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "readiness-probe-", Namespace: systemNamespace},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             "lockwarden-bench/readiness-probe",
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

// freePorts returns n distinct TCP ports on 127.0.0.1 that nobody listens
// on now.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
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
