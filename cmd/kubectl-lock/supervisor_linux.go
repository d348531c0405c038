package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// asSupervisor runs the supervisor when args (the process's arguments
// after its name) ask for it, and returns its exit code and true; else
// 0, false.
func asSupervisor(args []string) (int, bool) {
	if len(args) == 0 || args[0] != superviseArg {
		return 0, false
	}
	return supervise(args[1:]), true
}

// killRetry is how often the supervisor sends SIGKILL again to whatever
// still runs below it once the grace is over: a process forked while the
// previous round was sent is caught by the next.
const killRetry = 50 * time.Millisecond

// supervise is the supervisor of one run command (supervisedCommand):
//
//	kubectl-lockwarden __lockwarden-run-supervisor [-grace D] [-pgid G] -- COMMAND [ARG...]
//
// It starts COMMAND, in a process group of its own or in process group G,
// with SIGKILL as its parent-death signal, and reports on the status pipe
// whether it started. As the child subreaper of everything below it, it
// sees every process the command starts, also one that left the command's
// process group or session (setsid) and whose parent exited: such orphans
// are reparented to it, not to init. It stops all of them
//   - at the local deadline the plugin sent last (a deadline line, after
//     every confirmed renewal): SIGTERM (and SIGCONT) D before it, SIGKILL
//     at it, unless the plugin moves it first. A plugin that is frozen, cut
//     off or dead moves nothing: this is what keeps the command from
//     outliving the lock whatever happens to the plugin;
//   - when the plugin writes the stop line (the lock is lost or in doubt):
//     SIGTERM (and SIGCONT) at once, SIGKILL after D or at the deadline,
//     whichever is first;
//   - when the command exits: what it left running gets the same, before
//     the plugin releases the lock;
//   - when the control pipe closes, that is when the plugin died: SIGKILL
//     at once, since how long the lease still runs died with the plugin.
//
// It passes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to
// the command (to its process group unless G is set; one it was started
// with ignored stays ignored), and exits with the command's exit code once
// no process is left below it.
func supervise(args []string) int {
	// The command's parent-death signal fires when the thread that started
	// it ends: keep this goroutine on its thread for good.
	runtime.LockOSThread()
	status := os.NewFile(statusFD, "status")
	report := func(code int, err error) int {
		fmt.Fprintf(status, "%d %s\n", code, strings.ReplaceAll(err.Error(), "\n", " "))
		_ = status.Close()
		return code
	}
	fs := flag.NewFlagSet(superviseArg, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors go to the plugin, on the status pipe
	grace := fs.Duration("grace", 0, "SIGKILL this long after SIGTERM")
	pgid := fs.Int("pgid", 0, "process group for the command (default: its own)")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		return report(exitRunFailed, fmt.Errorf("usage: %s [-grace D] [-pgid G] -- COMMAND [ARG...]", superviseArg))
	}
	// The pipes are the plugin's and the supervisor's, never the command's.
	unix.CloseOnExec(controlFD)
	unix.CloseOnExec(statusFD)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return report(exitRunFailed, fmt.Errorf("becoming the command's subreaper: %w", err))
	}
	forwarded := make(chan os.Signal, 8)
	for _, sig := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2} {
		// One ignored from the start (a background job's SIGQUIT) stays
		// ignored, for the command too, as it was under the plugin.
		if !signal.Ignored(sig) {
			signal.Notify(forwarded, sig)
		}
	}
	// A write to a closed stderr must not end the supervisor.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	argv := fs.Args()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: *pgid, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return report(startErrorCode(err), err)
	}
	fmt.Fprintln(status, startedLine)
	_ = status.Close()
	s := &supervisor{cmd: cmd, ownGroup: *pgid == 0, grace: *grace, self: os.Getpid()}
	return s.run(os.NewFile(controlFD, "control"), forwarded)
}

// supervisor is the state of supervise once the command runs.
type supervisor struct {
	cmd *exec.Cmd
	// ownGroup: the command leads a process group of its own, which
	// forwarded signals go to.
	ownGroup bool
	grace    time.Duration
	self     int

	// deadline is the local deadline the plugin sent last (zero: none
	// yet): SIGTERM goes out grace before it and SIGKILL at it, unless the
	// plugin moves it first. The plugin may be frozen or dead by then; the
	// supervisor does not wait to be told.
	deadline time.Time
	// killBy is when SIGKILL goes out at the latest once stopping began
	// (zero: not yet): never moved later.
	killBy time.Time
	// terminated: SIGTERM was sent. killing: SIGKILL rounds go out, the
	// next one at nextKill.
	terminated, killing bool
	nextKill            time.Time
}

// run supervises until no process is left below the supervisor, and
// returns the command's exit code.
func (s *supervisor) run(control *os.File, forwarded <-chan os.Signal) int {
	exited, empty := make(chan int, 1), make(chan struct{})
	go reap(s.cmd.Process.Pid, exited, empty)
	orders := make(chan order)
	go readControl(control, orders)

	code := exitRunFailed
	timer := time.NewTimer(time.Hour)
	for {
		select {
		case code = <-exited:
			s.stop(time.Now().Add(s.grace)) // what the command left running
		case <-empty:
			select {
			case code = <-exited:
			default:
			}
			return code
		case o := <-orders:
			switch {
			case o.closed:
				s.stop(time.Now()) // the plugin is gone
			case o.stop:
				s.stop(time.Now().Add(s.grace))
			default:
				s.deadline = o.deadline
			}
		case sig := <-forwarded:
			s.forward(sig)
		case <-timer.C:
		}
		if refused := s.act(time.Now()); refused != nil {
			// Only processes the supervisor may not signal are left
			// (they changed their user): it cannot wait for them.
			fmt.Fprintf(os.Stderr, "kubectl-lockwarden: cannot kill what the command started: %v; it keeps running\n", refused)
			return code
		}
		timer.Reset(time.Until(s.next()))
	}
}

// stop begins stopping the command's tree: SIGTERM (and SIGCONT) at once,
// SIGKILL at by, or at the deadline if that comes first. by = now: SIGKILL
// at once, without SIGTERM.
func (s *supervisor) stop(by time.Time) {
	if s.killBy.IsZero() || by.Before(s.killBy) {
		s.killBy = by
	}
	if !s.terminated && time.Until(by) > 0 {
		s.terminate()
	}
}

// terminate sends SIGTERM, and SIGCONT so that a stopped process handles it.
func (s *supervisor) terminate() {
	s.terminated = true
	_, _ = s.signalAll(unix.SIGTERM)
	_, _ = s.signalAll(unix.SIGCONT)
}

// killLead is how long before the deadline the first SIGKILL round goes
// out: listing /proc and signalling every process takes a moment (about
// 10 ms on a loaded machine), and the last process must be dead at the
// deadline, not signalled.
const killLead = 100 * time.Millisecond

// killAt is when SIGKILL is due: the earlier of killBy and the deadline
// less killLead (zero: not due).
func (s *supervisor) killAt() time.Time {
	at := s.killBy
	if d := s.deadline.Add(-killLead); !s.deadline.IsZero() && (at.IsZero() || d.Before(at)) {
		at = d
	}
	return at
}

// act does what is due at now: SIGTERM grace before the deadline, SIGKILL
// at the deadline or at killBy, and again every killRetry once it began.
// It returns the error of a process it may not signal when no process was
// reached.
func (s *supervisor) act(now time.Time) error {
	if !s.terminated && !s.deadline.IsZero() && !now.Before(s.deadline.Add(-s.grace)) {
		// The plugin did not move its deadline in time: frozen, cut off,
		// or slower than the clock. Stopping, once begun, is not undone.
		s.stop(s.deadline.Add(-killLead))
	}
	at := s.killAt()
	if at.IsZero() || now.Before(at) || (s.killing && now.Before(s.nextKill)) {
		return nil
	}
	s.killing = true
	s.nextKill = now.Add(killRetry)
	if sent, refused := s.signalAll(unix.SIGKILL); sent == 0 && refused != nil {
		return refused
	}
	return nil
}

// next is when act has something to do next (far ahead when nothing is
// due).
func (s *supervisor) next() time.Time {
	next := time.Now().Add(time.Hour)
	earliest := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	if !s.terminated && !s.deadline.IsZero() {
		earliest(s.deadline.Add(-s.grace))
	}
	if s.killing {
		earliest(s.nextKill)
	} else {
		earliest(s.killAt())
	}
	return next
}

// forward passes sig on to the command's process group, or to the command
// alone when it shares the plugin's group.
func (s *supervisor) forward(sig os.Signal) {
	if !s.ownGroup {
		_ = s.cmd.Process.Signal(sig)
		return
	}
	if n, ok := sig.(syscall.Signal); ok {
		_ = unix.Kill(-s.cmd.Process.Pid, n)
	}
}

// signalAll sends sig to every process below the supervisor, and returns
// how many it reached and the error of one it may not signal.
func (s *supervisor) signalAll(sig unix.Signal) (sent int, refused error) {
	for _, p := range descendants(s.self) {
		switch err := p.signal(sig); {
		case err == nil:
			sent++
		case errors.Is(err, unix.EPERM):
			refused = fmt.Errorf("process %d: %w", p.pid, err)
		}
	}
	return sent, refused
}

// reap collects every child of the supervisor (the command, and the orphans
// of its tree reparented here), sends the command's exit code on exited,
// and closes empty when no child is left. A subreaper with no child has no
// descendant either: an orphan is reparented before its parent can be
// collected.
func reap(command int, exited chan<- int, empty chan<- struct{}) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil: // ECHILD
			close(empty)
			return
		case pid == command:
			exited <- waitCode(ws)
		}
	}
}

// waitCode is the shell's view of ws: the exit status, or 128+S when
// signal S ended the process.
func waitCode(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// order is one message from the plugin on the control pipe.
type order struct {
	// closed: the pipe is closed, the plugin has exited, however it ended.
	closed bool
	// stop: the lock is lost or in doubt.
	stop bool
	// deadline: the local deadline moved (neither closed nor stop).
	deadline time.Time
}

// readControl sends every order the plugin writes on control, and a closed
// one once the pipe is closed. A deadline comes as CLOCK_MONOTONIC
// nanoseconds, the clock the plugin measured it on, and goes out as a
// time.Time of this process.
func readControl(control *os.File, orders chan<- order) {
	r := bufio.NewReader(control)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			orders <- order{closed: true}
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == stopLine:
			orders <- order{stop: true}
		case strings.HasPrefix(line, deadlinePrefix):
			at, err := strconv.ParseInt(strings.TrimPrefix(line, deadlinePrefix), 10, 64)
			if err == nil {
				orders <- order{deadline: time.Now().Add(time.Duration(at - monoNow()))}
			}
		}
	}
}

// proc is one process as /proc showed it: its pid, its parent's, and its
// start time (in clock ticks after boot), which tells it from a later
// process given the same pid.
type proc struct {
	pid, ppid int
	start     uint64
}

// readProc reads /proc/PID/stat.
func readProc(pid int) (proc, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return proc{}, false
	}
	// pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime priority nice num_threads
	// itrealvalue starttime ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return proc{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return proc{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return proc{}, false
	}
	return proc{pid: pid, ppid: ppid, start: start}, true
}

// descendants lists the processes below root, from one pass over /proc. A
// process forked during the pass may be missing: callers that must catch
// every process repeat until none is left.
func descendants(root int) []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []proc
	for next := []int{root}; len(next) > 0; {
		pid := next[0]
		next = next[1:]
		for _, c := range children[pid] {
			out = append(out, c)
			next = append(next, c.pid)
		}
	}
	return out
}

// signal sends sig to p, and to no other process that got p's pid after p
// ended: through a pidfd opened before checking that the pid still has
// p's start time.
func (p proc) signal(sig unix.Signal) error {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if errors.Is(err, unix.ENOSYS) { // Linux before 5.3: only the check is left
		if !p.alive() {
			return unix.ESRCH
		}
		return unix.Kill(p.pid, sig)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd) //nolint:errcheck // a pidfd
	if !p.alive() {
		return unix.ESRCH
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// alive reports whether p's pid still belongs to p.
func (p proc) alive() bool {
	now, ok := readProc(p.pid)
	return ok && now.start == p.start
}
