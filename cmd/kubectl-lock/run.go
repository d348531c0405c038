package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// Environment variables `run` passes to the command.
const (
	EnvFence     = "LOCKWARDEN_FENCE"
	EnvGrant     = "LOCKWARDEN_GRANT"
	EnvGrantUID  = "LOCKWARDEN_GRANT_UID"
	EnvNamespace = "LOCKWARDEN_NAMESPACE"
	EnvResource  = "LOCKWARDEN_RESOURCE"
	EnvRequestID = "LOCKWARDEN_REQUEST_ID"
)

func (a *app) runCmd() *cobra.Command {
	var o acquireOptions
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "run RESOURCE [--ttl 30s] [--wait 0] [--grace 10s] -- COMMAND [ARG...]",
		Short: "Run a command while holding the lock on RESOURCE",
		Long: `Take the lock on RESOURCE (waiting in its queue, with a progress line on
stderr), run COMMAND while renewing the lease, and release the lock when
COMMAND exits.

COMMAND gets the lock in its environment: LOCKWARDEN_FENCE, LOCKWARDEN_GRANT
(the grant's name), LOCKWARDEN_NAMESPACE, LOCKWARDEN_RESOURCE,
LOCKWARDEN_GRANT_UID and LOCKWARDEN_REQUEST_ID. Writes it makes to guarded
objects must carry annotations
  locking.lockwarden.io/grant=$LOCKWARDEN_NAMESPACE/$LOCKWARDEN_GRANT
  locking.lockwarden.io/fence=$LOCKWARDEN_FENCE
and be made as the same Kubernetes user.

The moment ownership becomes unknown (renewals did not get through before
the local deadline: TTL minus a margin after the last confirmed renew was
sent) or is lost, COMMAND is sent SIGTERM, then SIGKILL after --grace, and
kubectl lock exits with code 123. Unless stdin is a terminal, COMMAND runs
in its own process group, and signals go to the whole group. SIGINT, SIGTERM
and SIGHUP sent to kubectl lock are passed on to COMMAND.`,
		Example: `  kubectl lock run db/orders --ttl 30s --wait 5m -- ./migrate.sh
  kubectl lock run reports/nightly -- sh -c 'generate-report --fence "$LOCKWARDEN_FENCE"'`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: a.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash != 1 || len(args) < 2 {
				return &exitErr{code: exitRunFailed, err: errors.New("usage: kubectl lock run RESOURCE [flags] -- COMMAND [ARG...]")}
			}
			code, err := a.run(args[0], args[1:], o, grace)
			if err != nil {
				return &exitErr{code: code, err: err}
			}
			if code != exitOK {
				return &exitErr{code: code}
			}
			return nil
		},
	}
	o.addFlags(cmd)
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "How long COMMAND has to exit after SIGTERM before it is killed.")
	return cmd
}

// run holds the lock on resource while argv runs, and returns the exit code.
func (a *app) run(resource string, argv []string, o acquireOptions, grace time.Duration) (int, error) {
	locks, c, ns, err := a.locks()
	if err != nil {
		return exitRunFailed, err
	}
	// The session keeps the request alive while this process waits and
	// holds; ending it on the way out frees the queue at once.
	defer func() { _ = locks.Close(context.Background()) }()
	// Signals: while waiting they cancel the request; while the command
	// runs they are passed on to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	acquiring, watcher := make(chan struct{}), make(chan struct{})
	var interrupted syscall.Signal
	go func() {
		defer close(watcher)
		select {
		case s := <-sigs:
			interrupted, _ = s.(syscall.Signal)
			cancel()
		case <-acquiring:
		}
	}()

	p := newProgress(a.streams.ErrOut, c, ns, resource)
	h, err := locks.Acquire(ctx, resource, append(o.lockOptions(), lock.WithProgress(p.update))...)
	close(acquiring)
	<-watcher
	if err != nil {
		p.finish("")
		switch {
		case errors.Is(err, lock.ErrWaitTimeout):
			return exitNotAcquired, err
		case interrupted != 0:
			return 128 + int(interrupted), fmt.Errorf("interrupted while waiting; the request was withdrawn: %w", err)
		}
		return exitRunFailed, err
	}
	p.finish(fmt.Sprintf("acquired %s: grant %s, fence %d", resource, h.Grant().Name, h.Fence()))
	release := func() error {
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		res, err := h.Release(rctx)
		switch {
		case err != nil:
			return fmt.Errorf("releasing grant %s: %w (its lease will run out)", h.Grant().Name, err)
		case res != lock.Released && errors.Is(h.Err(), lock.ErrReleased):
			// The lease ended before the release arrived, unnoticed.
			return fmt.Errorf("releasing grant %s: %w", h.Grant().Name, &fencing.Error{Reason: res.Reason(), Detail: releaseDetail(res)})
		}
		return nil
	}

	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = a.streams.In, a.streams.Out, a.streams.ErrOut
	child.Env = append(os.Environ(),
		EnvFence+"="+fencing.FormatFence(h.Fence()),
		EnvGrant+"="+h.Grant().Name,
		EnvGrantUID+"="+string(h.UID()),
		EnvNamespace+"="+h.Grant().Namespace,
		EnvResource+"="+resource,
		EnvRequestID+"="+h.RequestID(),
	)
	interactive := isTerminal(a.streams.In)
	if !interactive {
		child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := child.Start(); err != nil {
		_ = release()
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return code, err
	}
	signalChild := func(s syscall.Signal) {
		if interactive {
			_ = child.Process.Signal(s)
		} else {
			_ = syscall.Kill(-child.Process.Pid, s)
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	for {
		select {
		case err := <-exited:
			code := exitCode(child.ProcessState, err)
			if rerr := release(); rerr != nil {
				fmt.Fprintf(a.streams.ErrOut, "kubectl-lock: warning: %v\n", rerr)
			}
			return code, nil
		case <-h.Done():
			cause := h.Err()
			fmt.Fprintf(a.streams.ErrOut, "kubectl-lock: %v; stopping the command (SIGTERM, SIGKILL after %s)\n", cause, grace)
			signalChild(syscall.SIGTERM)
			t := time.NewTimer(grace)
			select {
			case <-exited:
			case <-t.C:
				signalChild(syscall.SIGKILL)
				<-exited
			}
			t.Stop()
			if rerr := release(); rerr != nil {
				fmt.Fprintf(a.streams.ErrOut, "kubectl-lock: %v\n", rerr)
			}
			return exitLockLost, fmt.Errorf("lock on %s lost while the command ran: %w", resource, cause)
		case s := <-sigs:
			// A terminal's Ctrl-C already reached an interactive command.
			if sig, ok := s.(syscall.Signal); ok && !(interactive && sig == syscall.SIGINT) {
				signalChild(sig)
			}
		}
	}
}

// exitCode is the shell's view of how a command ended: its exit status, or
// 128+S when signal S killed it.
func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		if err != nil {
			return exitRunFailed
		}
		return exitOK
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
