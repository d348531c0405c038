package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// leaderElectionID is the manager's leader election Lease, in
// localcp.SystemNamespace.
const leaderElectionID = "lockwarden.locking.lockwarden.io"

// managerStopGrace is how long a replica has to exit after a signal before
// it is killed.
const managerStopGrace = 10 * time.Second

// replica is one manager replica: a bin/manager process (localcp.Manager)
// with leader election on, which the chaos driver kills and starts again.
// Its webhook and metrics ports stay the same across restarts, so the
// webhook balancer keeps its backend list.
type replica struct {
	index int
	opts  localcp.ManagerOptions

	mu    sync.Mutex
	m     *localcp.Manager
	gen   int
	ready bool
}

// newReplica reserves the replica's ports. kubeconfig points at the
// replica's own fault proxy in front of the API server.
func newReplica(index int, bin, kubeconfig, dir string) (*replica, error) {
	webhookPort, err := localcp.FreePort()
	if err != nil {
		return nil, err
	}
	metricsPort, err := localcp.FreePort()
	if err != nil {
		return nil, err
	}
	probePort, err := localcp.FreePort()
	if err != nil {
		return nil, err
	}
	return &replica{index: index, opts: localcp.ManagerOptions{
		Binary: bin, Kubeconfig: kubeconfig, Dir: dir,
		WebhookPort: webhookPort,
		MetricsAddr: "127.0.0.1:" + strconv.Itoa(metricsPort),
		ProbeAddr:   "127.0.0.1:" + strconv.Itoa(probePort),
		Args: []string{
			"--leader-elect",
			"--leader-election-namespace=" + localcp.SystemNamespace,
			// Both replicas grant; the leader only keeps the issuer's keys.
			"--grants-on-every-replica=true",
			"--namespace=" + localcp.SystemNamespace,
			"--webhook-host=127.0.0.1",
			// Keep every finished grant: the checker lists them at the end.
			"--finished-grant-retention=0",
		},
	}}, nil
}

// name is the replica's name in the history and the output.
func (r *replica) name() string { return fmt.Sprintf("manager-%d", r.index) }

// probeAddr is where the replica serves /readyz.
func (r *replica) probeAddr() string { return r.opts.ProbeAddr }

// webhookAddr is where the replica serves admission.
func (r *replica) webhookAddr() string { return "127.0.0.1:" + strconv.Itoa(r.opts.WebhookPort) }

// start starts a new process of the replica, logging to
// manager-INDEX.START.log.
func (r *replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil && r.m.Running() == nil {
		return fmt.Errorf("%s is already running", r.name())
	}
	r.gen++
	opts := r.opts
	opts.LogName = fmt.Sprintf("manager-%d.%d.log", r.index, r.gen)
	m, err := localcp.StartManager(opts)
	if err != nil {
		return fmt.Errorf("starting %s: %w", r.name(), err)
	}
	r.m, r.ready = m, false
	return nil
}

// waitReady waits until the replica is ready and admission answers, and
// marks it ready.
func (r *replica) waitReady(ctx context.Context, c client.Client) error {
	r.mu.Lock()
	m := r.m
	r.mu.Unlock()
	if m == nil {
		return fmt.Errorf("%s was never started", r.name())
	}
	if err := m.WaitReady(ctx, c); err != nil {
		return fmt.Errorf("%s: %w", r.name(), err)
	}
	r.mu.Lock()
	r.ready = true
	r.mu.Unlock()
	return nil
}

// up reports whether the replica runs and has been ready since its start.
func (r *replica) up() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m != nil && r.ready && r.m.Running() == nil
}

// running reports whether the replica's process is alive.
func (r *replica) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m != nil && r.m.Running() == nil
}

// kill sends sig to the replica and waits for it to exit, killing it after
// a grace period.
func (r *replica) kill(sig syscall.Signal) {
	r.mu.Lock()
	m := r.m
	r.ready = false
	r.mu.Unlock()
	if m == nil || m.Running() != nil {
		return
	}
	_ = m.Process().Signal(sig)
	select {
	case <-m.Exited():
	case <-time.After(managerStopGrace):
		fmt.Fprintf(os.Stderr, "warning: %s did not stop within %s of %s; killing it\n", r.name(), managerStopGrace, sig)
		_ = m.Process().Kill()
		<-m.Exited()
	}
}

// stop ends the replica for good (SIGTERM, then SIGKILL).
func (r *replica) stop() { r.kill(syscall.SIGTERM) }

// leader reports whether the replica says it leads, from its
// leader_election_master_status metric.
func (r *replica) leader(ctx context.Context) bool {
	r.mu.Lock()
	m := r.m
	r.mu.Unlock()
	if m == nil || m.Running() != nil {
		return false
	}
	v, _, err := m.Metric(ctx, "leader_election_master_status", `name="`+leaderElectionID+`"`)
	return err == nil && v == 1
}
