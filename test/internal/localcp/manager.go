package localcp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// What config/local installs and the manager serves.
const (
	// DefaultWebhookPort is where config/local points the API server.
	DefaultWebhookPort = 9443
	// SystemNamespace is the manager's namespace in config/local.
	SystemNamespace      = "lockwarden-system"
	webhookCertSecret    = SystemNamespace + "/lockwarden-webhook-server-cert"
	mutatingConfigName   = "lockwarden-mutating-webhook-configuration"
	validatingConfigName = "lockwarden-validating-webhook-configuration"

	managerReadyTimeout = 90 * time.Second
	managerStopGrace    = 10 * time.Second
)

// Manager is the lockwarden manager running as a child process.
type Manager struct {
	cmd         *exec.Cmd
	metricsAddr string
	// LogPath is the file the manager logs to.
	LogPath   string
	probeAddr string
	// exited is closed when the process has exited; err is then its exit
	// status.
	exited chan struct{}
	err    error
}

// ManagerOptions say how to run the manager.
type ManagerOptions struct {
	// Binary is the manager binary (bin/manager).
	Binary string
	// Kubeconfig is the kubeconfig it runs with (the admin's).
	Kubeconfig string
	// Dir is where its log goes, as LogName (default manager.log).
	Dir, LogName string
	// WebhookPort is its webhook port on localhost (the one the webhook
	// configuration names); DefaultWebhookPort when 0.
	WebhookPort int
	// MetricsAddr is where it serves /metrics (host:port); off when empty.
	MetricsAddr string
	// Args are further flags, e.g. --leader-elect or
	// --finished-grant-retention=10s.
	Args []string
	// Exact runs the manager with --kubeconfig and Args only, none of the
	// flags above (as a test of an installer's Deployment does: its flags,
	// not config/local's). ProbeAddr must then name the
	// --health-probe-bind-address among Args, for WaitReady.
	Exact bool
	// ProbeAddr is where the manager serves /healthz and /readyz
	// (host:port); a free port of 127.0.0.1 when empty.
	ProbeAddr string
	// Env is added to the manager's environment (NAME=value).
	Env []string
}

// StartManager starts the manager, which generates its webhook certificate
// in the Secret config/local creates. It fails at once if the webhook port
// is taken. Wait for it with WaitReady.
func StartManager(o ManagerOptions) (*Manager, error) {
	if o.WebhookPort == 0 {
		o.WebhookPort = DefaultWebhookPort
	}
	if o.LogName == "" {
		o.LogName = "manager.log"
	}
	if err := CheckPortFree(o.WebhookPort); err != nil {
		return nil, err
	}
	probeAddr := o.ProbeAddr
	if probeAddr == "" {
		probePort, err := FreePort()
		if err != nil {
			return nil, err
		}
		probeAddr = "127.0.0.1:" + strconv.Itoa(probePort)
	}
	metrics := o.MetricsAddr
	if metrics == "" {
		metrics = "0"
	}
	m := &Manager{
		metricsAddr: o.MetricsAddr,
		LogPath:     filepath.Join(o.Dir, o.LogName),
		probeAddr:   probeAddr,
		exited:      make(chan struct{}),
	}
	logFile, err := os.Create(m.LogPath)
	if err != nil {
		return nil, err
	}
	bin := o.Binary
	args := []string{
		"--kubeconfig", o.Kubeconfig,
		"--webhook-cert-secret=" + webhookCertSecret,
		"--webhook-dns-name=localhost",
		"--webhook-port=" + strconv.Itoa(o.WebhookPort),
		"--metrics-bind-address=" + metrics,
		// Plain HTTP on localhost: MetricsText scrapes it without a token.
		"--metrics-secure=false",
		"--health-probe-bind-address=" + m.probeAddr,
	}
	if o.Exact {
		args = []string{"--kubeconfig", o.Kubeconfig}
		m.probeAddr = o.ProbeAddr
	}
	m.cmd = exec.Command(bin, append(args, o.Args...)...)
	m.cmd.Env = append(os.Environ(), o.Env...)
	m.cmd.Stdout, m.cmd.Stderr = logFile, logFile
	// Its own process group: a Ctrl-C in the terminal reaches the caller
	// only, which then stops the manager in order. It is killed if the
	// caller dies without stopping it.
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

// Exited is closed when the manager process has exited.
func (m *Manager) Exited() <-chan struct{} { return m.exited }

// Process is the manager's process, e.g. to send it signals.
func (m *Manager) Process() *os.Process { return m.cmd.Process }

// WaitReady waits until /readyz answers 200, both webhook configurations
// carry the manager's CA, and the LockGrant webhook itself answers: a grant
// naming another owner is refused with NOT_OWNER, rather than failing to
// reach the webhook.
func (m *Manager) WaitReady(ctx context.Context, c client.Client) error {
	var notYet string
	httpc := &http.Client{Timeout: 2 * time.Second}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, managerReadyTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-m.exited:
			return false, fmt.Errorf("the manager exited (%w); last lines of %s:\n%s", m.err, m.LogPath, Tail(m.LogPath, 15))
		default:
		}
		if notYet = m.readyz(ctx, httpc); notYet != "" {
			return false, nil
		}
		if notYet = caBundlesInjected(ctx, c); notYet != "" {
			return false, nil
		}
		notYet = ProbeWebhook(ctx, c)
		return notYet == "", nil
	})
	if err != nil && notYet != "" && ctx.Err() == nil {
		return fmt.Errorf("the manager was not ready after %s: %s (log: %s)", managerReadyTimeout, notYet, m.LogPath)
	}
	return err
}

// readyz returns "" when the manager's /readyz answers 200, else why not.
func (m *Manager) readyz(ctx context.Context, httpc *http.Client) string {
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

// ProbeWebhook creates a LockGrant whose owner is not the requester; it
// returns "" when admission refuses it with NOT_OWNER, else what happened
// (a TLS or connection error while the webhook is still coming up).
func ProbeWebhook(ctx context.Context, c client.Client) string {
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "readiness-probe-", Namespace: SystemNamespace},
		Spec: lockingv1alpha1.LockGrantSpec{
			Resource:             "lockwarden/readiness-probe",
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

// MetricsText returns the manager's /metrics (ManagerOptions.MetricsAddr)
// in the Prometheus text format.
func (m *Manager) MetricsText(ctx context.Context) (string, error) {
	if m.metricsAddr == "" {
		return "", fmt.Errorf("the manager serves no metrics (ManagerOptions.MetricsAddr)")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.metricsAddr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Metric scrapes /metrics and returns the value of the series name{labels}
// (labels as in the exposition format, e.g. `reason="FENCE_REGRESSION"`,
// several joined by commas in name order), 0 when the series is absent, and
// every sample of that metric, one per line.
func (m *Manager) Metric(ctx context.Context, name, labels string) (float64, []string, error) {
	text, err := m.MetricsText(ctx)
	if err != nil {
		return 0, nil, err
	}
	return seriesValue(text, name, labels)
}

// seriesValue is Metric on a scrape's text.
func seriesValue(text, name, labels string) (float64, []string, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return 0, nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	fam, ok := fams[name]
	if !ok {
		return 0, nil, nil
	}
	samples, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, fam)
	if err != nil {
		return 0, nil, fmt.Errorf("reading %s: %w", name, err)
	}
	var value float64
	var lines []string
	for _, s := range samples {
		lines = append(lines, s.Metric.String()+" "+s.Value.String())
		if string(s.Metric[model.MetricNameLabel]) == name && seriesLabels(s.Metric) == labels {
			value = float64(s.Value)
		}
	}
	return value, lines, nil
}

// seriesLabels writes a sample's labels, but its name, as the exposition
// format does: name="value" pairs in name order, joined by commas.
func seriesLabels(m model.Metric) string {
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k != model.MetricNameLabel {
			pairs = append(pairs, fmt.Sprintf("%s=%q", k, m[k]))
		}
	}
	return strings.Join(pairs, ",")
}

// Running returns nil while the process runs, else how it ended.
func (m *Manager) Running() error {
	select {
	case <-m.exited:
		return fmt.Errorf("the manager exited (%w); last lines of %s:\n%s", m.err, m.LogPath, Tail(m.LogPath, 20))
	default:
		return nil
	}
}

// Stop asks the manager to shut down (SIGTERM) and kills it after a grace
// period.
func (m *Manager) Stop() {
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

// CheckPortFree fails with a clear message when something already listens
// on port, or the port cannot be bound.
func CheckPortFree(port int) error {
	addr := net.JoinHostPort("localhost", strconv.Itoa(port))
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("port %d is already in use (another lockwarden manager, `make run`, or an earlier demo?): the webhook server needs it; stop that process and retry, or choose another port (make demo WEBHOOK_PORT=9555)", port)
	}
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("port %d cannot be bound (%w): the webhook server needs it; free it and retry", port, err)
	}
	return l.Close()
}

// FreePort returns a TCP port on 127.0.0.1 that nobody listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
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
