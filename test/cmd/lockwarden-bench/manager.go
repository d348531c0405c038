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

	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// managerProc is the lockwarden manager under measurement: the process
// internal/localcp runs, with plain-HTTP metrics on a free port.
type managerProc struct {
	m *localcp.Manager
	// second is a second replica (--replicas 2): it grants beside the
	// first, as in a cluster, on its own webhook port, which the API server
	// does not call. Its CPU counts as the manager's.
	second *localcp.Manager
}

// startManager starts the manager against the admin kubeconfig, with its
// webhook server on 127.0.0.1:webhookPort, metrics on a free port of
// 127.0.0.1, the given finished-grant retention, and its log in logPath.
func startManager(bin, kubeconfig, logPath string, webhookPort int, retention time.Duration, replicas int) (*managerProc, error) {
	start := func(logName string, webhookPort int) (*localcp.Manager, error) {
		metricsPort, err := localcp.FreePort()
		if err != nil {
			return nil, err
		}
		return localcp.StartManager(localcp.ManagerOptions{
			Binary: bin, Kubeconfig: kubeconfig,
			Dir: filepath.Dir(logPath), LogName: logName,
			WebhookPort: webhookPort,
			MetricsAddr: "127.0.0.1:" + strconv.Itoa(metricsPort),
			Args:        []string{"--webhook-host=127.0.0.1", "--finished-grant-retention=" + retention.String()},
		})
	}
	m, err := start(filepath.Base(logPath), webhookPort)
	if err != nil {
		return nil, err
	}
	p := &managerProc{m: m}
	if replicas > 1 {
		port, err := localcp.FreePort()
		if err != nil {
			p.stop()
			return nil, err
		}
		if p.second, err = start("second-"+filepath.Base(logPath), port); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

// waitReady waits until the manager and its webhooks answer.
func (p *managerProc) waitReady(ctx context.Context, c client.Client) error {
	if p.second != nil {
		if err := p.second.WaitReady(ctx, c); err != nil {
			return err
		}
	}
	return p.m.WaitReady(ctx, c)
}

// stop stops the manager (both replicas).
func (p *managerProc) stop() {
	if p.second != nil {
		p.second.Stop()
	}
	p.m.Stop()
}

// cpuSeconds is the CPU time of every replica.
func (p *managerProc) cpuSeconds() float64 {
	s := cpuSeconds(p.pid())
	if p.second != nil {
		s += cpuSeconds(p.second.Process().Pid)
	}
	return s
}

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
