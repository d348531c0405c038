package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// Environment variables `run` passes to the command.
const (
	EnvFence     = "LOCKWARDEN_FENCE"
	EnvGrant     = "LOCKWARDEN_GRANT"
	EnvGrantUID  = "LOCKWARDEN_GRANT_UID"
	EnvNamespace = "LOCKWARDEN_NAMESPACE"
	EnvResource  = "LOCKWARDEN_RESOURCE"
	EnvRequestID = "LOCKWARDEN_REQUEST_ID"
	// EnvPermit is the permit (slot) the grant holds, from 0: always 0 for
	// an exclusive lock.
	EnvPermit = "LOCKWARDEN_PERMIT"
	// EnvFencedResource is the fenced resource ID of the permit held: the
	// resource ID for an exclusive lock and for permit 0, the resource ID
	// and "#k" for permit k. The fence belongs to it, and guarded writes
	// name it in annotation locking.lockwarden.io/resource.
	EnvFencedResource = "LOCKWARDEN_FENCED_RESOURCE"
	// EnvProof is the signed grant record (status.proof), "" when the
	// registry publishes none: what annotation locking.lockwarden.io/proof
	// carries on a guarded write, and what a verifier outside the cluster
	// checks with the trust bundle.
	EnvProof = "LOCKWARDEN_PROOF"
)

func (a *app) runCmd() *cobra.Command {
	var o acquireOptions
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "run RESOURCE [--ttl 30s] [--wait 0] [--grace 10s] [-- COMMAND [ARG...]]",
		Short: "Run a command while holding the lock on RESOURCE",
		Long: `Take the lock on RESOURCE (waiting in its queue, with a progress line on
stderr), run COMMAND while renewing the lease, and release the lock when
COMMAND exits.

COMMAND gets the lock in its environment: LOCKWARDEN_FENCE, LOCKWARDEN_GRANT
(the grant's name), LOCKWARDEN_NAMESPACE, LOCKWARDEN_RESOURCE,
LOCKWARDEN_GRANT_UID, LOCKWARDEN_REQUEST_ID, LOCKWARDEN_PROOF (the signed
grant record), LOCKWARDEN_PERMIT (the permit held, 0 for an exclusive lock)
and LOCKWARDEN_FENCED_RESOURCE (the ID the fence belongs to: RESOURCE for
an exclusive lock and permit 0, RESOURCE#k for permit k). Writes it makes
to guarded objects must carry annotations
  locking.lockwarden.io/resource=$LOCKWARDEN_FENCED_RESOURCE
  locking.lockwarden.io/grant=$LOCKWARDEN_NAMESPACE/$LOCKWARDEN_GRANT
  locking.lockwarden.io/fence=$LOCKWARDEN_FENCE
  locking.lockwarden.io/proof=$LOCKWARDEN_PROOF  (required under a GuardPolicy)
and be made as the same Kubernetes user.

With --permits N, up to N runs hold RESOURCE at once, each with its own
permit; the others wait in one FIFO queue. Each permit has its own fence
sequence and fenced resource ID, so an object written under one permit
refuses the fences of every other: an exclusive lock's guarantees, per
permit.

COMMAND is always killed before the controller can end the grant, by its
lease or by its session, and so before the next waiter can get the lock.
The moment ownership becomes doubtful (renewals did not get through in
time) or is lost, COMMAND and every process it started are sent SIGTERM,
then SIGKILL after --grace, and kubectl lockwarden exits with code 123.
SIGTERM is sent --grace before the local deadline, the earlier of the
lease's (TTL minus a safety margin after the last confirmed renew was
sent) and the session's (its duration less a tenth, at least 0.5s less,
after its last confirmed renewal was sent), so SIGKILL lands at that
deadline at the latest: at least a tenth of the TTL (at least 1s) before
the lease can end, and at least 1s plus a tenth of the session's duration
(at least 0.5s) before the session can lapse.
The grace therefore comes out of the lease: it can be at most
TTL - margin - 2 x TTL/3 (the margin is a tenth of the TTL, at least 1 s,
at most half of it), e.g. 2.3s for --ttl 10s, 7s for --ttl 30s, 14s for
--ttl 60s. Without --grace it is 10s or that limit, whichever is smaller; a
--grace that does not fit is refused (exit code 125): raise --ttl.
It comes out of the session too: run waits in the queue under a 5s session
(a run killed there is skipped about 6s later), and once it holds the lock
its session is lengthened to what the grace needs, about 4.3 x --grace
(30s for 7s): the registry cannot tell a run that died from one cut off
whose command still has its grace, so it ends the grant of either that long
plus 1s after the last session renewal it saw, or at the end of the lease
if that comes first.

Without COMMAND, run holds the lock until it is interrupted (Ctrl-C,
SIGTERM, SIGHUP), as etcdctl lock does: it prints the grant and its fence
on stdout, renews the lease, releases it on the signal and exits 0, or
exits 123 if the lock is lost or in doubt first.

--request-id makes a retried run find its own request; it never lets two
runs hold one grant. A run that finds the grant of its request ID held or
awaited by another run is refused with DRIVER_MISMATCH (exit code 3), and
one that finds it ended is refused with the reason it ended. Unless stdin is a terminal, COMMAND runs
in its own process group, and signals go to the whole group. SIGINT, SIGTERM
and SIGHUP sent to kubectl lockwarden are passed on to COMMAND.

On Linux, COMMAND runs under a supervisor (this binary again) that sees
every process COMMAND starts, also one that calls setsid or double-forks.
The supervisor keeps the local deadline itself (SIGTERM --grace before
it, SIGKILL at it, unless kubectl lockwarden renewed in time), so COMMAND
is stopped in time also when kubectl lockwarden is frozen. When COMMAND exits, what it left running gets SIGTERM, then SIGKILL after
--grace, before the lock is released. If kubectl lockwarden itself dies
(kill -9 included), everything COMMAND started is killed at once, while the
lease still runs. On macOS and Windows only COMMAND's process group (macOS)
or COMMAND itself (Windows) is stopped, and nothing when kubectl lockwarden
dies: see docs/run.md.`,
		Example: `  kubectl lockwarden run db/orders --ttl 30s --wait 5m -- ./migrate.sh
  kubectl lockwarden run reports/nightly -- sh -c 'generate-report --fence "$LOCKWARDEN_FENCE"'

  # At most 4 renders at once; each knows its permit.
  kubectl lockwarden run render/farm --permits 4 -- sh -c 'render --slot "$LOCKWARDEN_PERMIT"'`,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: a.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			if dash == -1 && len(args) == 1 {
				// No command: hold the lock until interrupted.
				args = append(args, "")
			} else if dash != 1 || len(args) < 2 {
				return &exitErr{code: exitRunFailed, err: errors.New("usage: kubectl lockwarden run RESOURCE [flags] -- COMMAND [ARG...]")}
			}
			g, err := fitGrace(o.ttl, grace, cmd.Flags().Changed("grace"))
			if err != nil {
				return &exitErr{code: exitRunFailed, err: err}
			}
			argv := args[1:]
			if argv[0] == "" {
				argv = nil
			}
			code, err := a.run(args[0], argv, o, g)
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
	cmd.Flags().BoolVar(&o.releaseByDelete, "release-by-delete", false, releaseByDeleteHelp)
	cmd.Flags().DurationVar(&grace, "grace", defaultGrace, "How long COMMAND has to exit after SIGTERM before it is killed; at most TTL - margin - 2 x TTL/3 (default 10s or that limit).")
	return cmd
}

// defaultGrace is --grace when it is not set and the lease leaves room.
const defaultGrace = 10 * time.Second

// maxGrace is the longest grace a lease of ttl leaves: the time from the
// local deadline to the end of the lease is the safety margin, which absorbs
// clock-rate differences and is never spent; so SIGTERM goes out grace
// before the local deadline, and the handle still needs two renew intervals
// before that to renew at least once and retry once.
func maxGrace(ttl time.Duration) time.Duration {
	return max(0, ttl-holder.DefaultMargin(ttl)-2*holder.DefaultRenewInterval(ttl))
}

// fitGrace returns the grace run uses: grace when it fits the lease,
// refused (errors.Is lock.ErrInvalidOption) when set explicitly and too
// long, else capped.
func fitGrace(ttl, grace time.Duration, explicit bool) (time.Duration, error) {
	limit := maxGrace(ttl)
	switch {
	case grace < 0:
		return 0, fmt.Errorf("%w: --grace %s is negative", lock.ErrInvalidOption, grace)
	case grace <= limit:
		return grace, nil
	case explicit:
		return 0, fmt.Errorf("%w: --grace %s does not fit a %s lease: SIGKILL must land before the lease can expire, so the grace is at most %s (TTL - margin - 2 x TTL/3); lower --grace or raise --ttl",
			lock.ErrInvalidOption, grace, ttl, limit)
	}
	return limit, nil
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

	p := newProgress(a.streams.ErrOut, c, ns, resource, o.permits)
	// The handle's Done comes grace early: SIGTERM then, SIGKILL at the
	// true local deadline, before the registry can end the grant by its
	// lease or by its session (which the library lengthens for the grace
	// once the grant is held).
	h, err := locks.Acquire(ctx, resource, append(o.lockOptions(), lock.WithProgress(p.update), lock.WithStopGrace(grace))...)
	close(acquiring)
	<-watcher
	if err != nil {
		p.finish("")
		switch {
		case errors.Is(err, lock.ErrWaitTimeout):
			return exitNotAcquired, err
		case interrupted != 0:
			return 128 + int(interrupted), fmt.Errorf("interrupted while waiting; the request was withdrawn: %w", err)
		case fencing.ReasonOf(err) != "":
			return exitRefused, err
		}
		return exitRunFailed, err
	}
	info := h.Info()
	acquired := fmt.Sprintf("acquired %s: grant %s, ", resource, info.Grant.Name)
	if permit := heldPermitText(info, o.permits); permit != "" {
		acquired += strings.TrimPrefix(permit, " ") + ", "
	}
	p.finish(acquired + fmt.Sprintf("fence %d", info.Fence))
	// release ends the grant. After the lock was lost or became doubtful
	// it gives up sooner: the lease runs out by itself within the margin.
	release := func(timeout time.Duration) error {
		rctx, rcancel := context.WithTimeout(context.Background(), timeout)
		defer rcancel()
		cause := context.Cause(h.Context())
		wasLost := cause != nil && !errors.Is(cause, lock.ErrReleased)
		err := h.Release(rctx)
		switch {
		case err == nil:
			return nil
		case fencing.ReasonOf(err) == "":
			return fmt.Errorf("releasing grant %s: %w (its lease will run out)", info.Grant.Name, err)
		case wasLost:
			return nil // the loss was reported already
		}
		// The lease ended before the release arrived, unnoticed.
		return err
	}

	if len(argv) == 0 {
		return a.hold(h, resource, heldPermitText(info, o.permits), sigs, release)
	}
	// The command gets the signed record with its fence: wait for the
	// grant's status, which may come a moment after the lock is held.
	if _, err := h.AwaitRecord(h.Context()); err != nil {
		_ = release(releaseTimeout)
		return exitLockLost, fmt.Errorf("lock on %s lost before the command started (grant %s): %w", resource, info.Grant.Name, err)
	}
	interactive := isTerminal(a.streams.In)
	child, code, err := startCommand(argv, commandEnv(h, resource), a.streams, interactive, grace)
	if err != nil {
		_ = release(releaseTimeout)
		return code, err
	}
	exited := make(chan int, 1)
	go func() { exited <- child.Wait() }()
	// The supervisor stops the command at the local deadline by itself,
	// unless told that it moved: a frozen or dead plugin moves nothing.
	remaining := func() time.Duration {
		left, _ := h.Check()
		return left
	}
	child.Extend(remaining)
	extend := time.NewTicker(extendEvery)
	defer extend.Stop()

	for {
		select {
		case <-extend.C:
			child.Extend(remaining)
		case code := <-exited:
			if _, err := h.Check(); err != nil && !errors.Is(err, lock.ErrReleased) {
				// The supervisor stopped the command at the deadline
				// (this process was frozen or slow), or the lock was
				// lost as the command ended.
				fmt.Fprintf(a.streams.ErrOut, "kubectl-lockwarden: %v; the command was stopped\n", err)
				if rerr := release(lostReleaseTimeout); rerr != nil {
					fmt.Fprintf(a.streams.ErrOut, "kubectl-lockwarden: %v\n", rerr)
				}
				return exitLockLost, fmt.Errorf("lock on %s lost while the command ran: %w", resource, err)
			}
			if rerr := release(releaseTimeout); rerr != nil {
				fmt.Fprintf(a.streams.ErrOut, "kubectl-lockwarden: warning: %v\n", rerr)
			}
			return code, nil
		case <-h.Context().Done():
			cause := context.Cause(h.Context())
			fmt.Fprintf(a.streams.ErrOut, "kubectl-lockwarden: %v; stopping the command (SIGTERM, SIGKILL after %s)\n", cause, grace)
			child.Stop()
			<-exited // the command's exit status no longer matters once the lock is lost
			if rerr := release(lostReleaseTimeout); rerr != nil {
				fmt.Fprintf(a.streams.ErrOut, "kubectl-lockwarden: %v\n", rerr)
			}
			return exitLockLost, fmt.Errorf("lock on %s lost while the command ran: %w", resource, cause)
		case s := <-sigs:
			// A terminal's Ctrl-C already reached an interactive command.
			if sig, ok := s.(syscall.Signal); ok && (!interactive || sig != syscall.SIGINT) {
				child.Signal(sig)
			}
		}
	}
}

// commandEnv is the environment COMMAND runs in: this process's, and the
// held grant of resource with its fence and signed record.
func commandEnv(h *lock.Handle, resource string) []string {
	info := h.Info()
	return append(os.Environ(),
		EnvFence+"="+fencing.FormatFence(info.Fence),
		EnvGrant+"="+info.Grant.Name,
		EnvGrantUID+"="+string(info.UID),
		EnvNamespace+"="+info.Grant.Namespace,
		EnvResource+"="+resource,
		EnvRequestID+"="+info.RequestID,
		EnvProof+"="+h.Proof(),
		EnvPermit+"="+strconv.Itoa(int(info.Permit)),
		EnvFencedResource+"="+info.FencedResource,
	)
}

// command is COMMAND as run started it, with everything it starts. Each
// platform has its own (startCommand).
type command interface {
	// Signal passes s on to the command: to its process group, or to the
	// command alone when it shares the terminal's (interactive).
	Signal(s syscall.Signal)
	// Stop ends the command and everything it started because the lock
	// is lost or in doubt: SIGTERM at once, SIGKILL after the grace.
	Stop()
	// Extend passes on the local deadline: remaining is the time left that
	// the handle's Check reports, until its Context ends, which comes the
	// grace early. On
	// Linux the supervisor stops the command at that deadline by itself
	// (SIGTERM the grace before it, SIGKILL at it) unless Extend moves it
	// first; elsewhere it does nothing.
	Extend(remaining func() time.Duration)
	// Wait waits until the command has exited (on Linux, until nothing
	// it started runs any more either), and returns the command's exit
	// code (128+S when signal S killed it). Called once.
	Wait() int
}

// startErrorCode is run's exit code when the command could not be
// started: 127 when it was not found, else 126.
func startErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return exitNotFound
	}
	return exitCannotExec
}

// hold keeps h until a signal (release, exit 0) or until ownership is lost
// or in doubt (exit 123).
func (a *app) hold(h *lock.Handle, resource, permit string, sigs <-chan os.Signal, release func(time.Duration) error) (int, error) {
	info := h.Info()
	fmt.Fprintf(a.streams.Out, "grant %s%s fence %d\n", info.Grant.Name, permit, info.Fence)
	select {
	case <-sigs:
		if err := release(releaseTimeout); err != nil {
			return exitRunFailed, err
		}
		return exitOK, nil
	case <-h.Context().Done():
		cause := context.Cause(h.Context())
		if rerr := release(lostReleaseTimeout); rerr != nil {
			fmt.Fprintf(a.streams.ErrOut, "kubectl-lockwarden: %v\n", rerr)
		}
		return exitLockLost, fmt.Errorf("lock on %s lost while held: %w", resource, cause)
	}
}

// extendEvery is how often run passes the local deadline on to the
// supervisor when it moved (after a confirmed renewal).
const extendEvery = 50 * time.Millisecond

// How long run waits for its release: after the command exited, and after
// the lock was lost or became doubtful (the lease runs out by itself then).
const (
	releaseTimeout     = 30 * time.Second
	lostReleaseTimeout = 5 * time.Second
)

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

// heldPermitText is " permit K (FENCED-RESOURCE)" for a handle on a resource
// with permits (the request named more than one, or the registry gave it a
// slot other than 0), "" for an exclusive lock.
func heldPermitText(info lock.Info, permits int32) string {
	if permits <= 1 && info.Permit == 0 {
		return ""
	}
	return fmt.Sprintf(" permit %d (%s)", info.Permit, info.FencedResource)
}
