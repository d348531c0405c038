package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/localcp"
)

// managerProc is the lockwarden manager under measurement: the process
// internal/localcp runs, with plain-HTTP metrics on a free port.
type managerProc struct {
	m *localcp.Manager
}

// startManager starts the manager against the admin kubeconfig, with its
// webhook server on 127.0.0.1:webhookPort, metrics on a free port of
// 127.0.0.1, the given finished-grant retention, and its log in logPath.
func startManager(bin, kubeconfig, logPath string, webhookPort int, retention time.Duration) (*managerProc, error) {
	metricsPort, err := localcp.FreePort()
	if err != nil {
		return nil, err
	}
	m, err := localcp.StartManager(localcp.ManagerOptions{
		Binary: bin, Kubeconfig: kubeconfig,
		Dir: filepath.Dir(logPath), LogName: filepath.Base(logPath),
		WebhookPort: webhookPort,
		MetricsAddr: "127.0.0.1:" + strconv.Itoa(metricsPort),
		Args:        []string{"--webhook-host=127.0.0.1", "--finished-grant-retention=" + retention.String()},
	})
	if err != nil {
		return nil, err
	}
	return &managerProc{m: m}, nil
}

// waitReady waits until the manager and its webhooks answer.
func (p *managerProc) waitReady(ctx context.Context, c client.Client) error {
	return p.m.WaitReady(ctx, c)
}

// stop stops the manager.
func (p *managerProc) stop() { p.m.Stop() }

// pid is the manager's process ID.
func (p *managerProc) pid() int { return p.m.Process().Pid }

// metrics returns the manager's Prometheus metrics, as text.
func (p *managerProc) metrics(ctx context.Context) (string, error) {
	text, err := p.m.MetricsText(ctx)
	if err != nil {
		return "", fmt.Errorf("scraping the manager's metrics: %w", err)
	}
	return text, nil
}

// memory returns the manager's resident set size and its peak, in bytes,
// from /proc/<pid>/status (VmRSS, VmHWM).
func (p *managerProc) memory() (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
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
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.pid())
	}
	return rss, peak, nil
}

// freePorts returns n TCP ports on 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := localcp.FreePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}
