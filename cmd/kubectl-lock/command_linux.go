package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// supervisedCommand is COMMAND under a supervisor: the plugin's own binary,
// re-executed (supervise), which starts the command, is the child subreaper
// of everything it starts, and stops all of it at the lock's local deadline
// unless the plugin moves it, when told to (the lock is lost), when the
// command exits, and when the plugin dies. See docs/run.md.
//
// The plugin and the supervisor are tied by two pipes. The plugin holds the
// only write end of the control pipe, where it writes lines: the local
// deadline each time it moves, a stop when the lock is lost; and the
// plugin's death, however it comes (SIGKILL, SIGQUIT, a crash), closes it,
// which the supervisor reads as end of file. The supervisor answers on the
// status pipe whether the command started.
type supervisedCommand struct {
	cmd *exec.Cmd
	// control is the write end of the control pipe; closed by Wait, after
	// the supervisor has exited.
	control *os.File
	// grace is the supervisor's; sent is the last deadline sent (Extend).
	grace time.Duration
	sent  int64
}

// The supervisor's protocol.
const (
	// superviseArg, as the first argument, makes kubectl-lockwarden the
	// supervisor of one run command instead of the plugin.
	superviseArg = "__lockwarden-run-supervisor"
	// stopLine on the control pipe: the lock is lost or in doubt.
	stopLine = "stop"
	// deadlinePrefix and CLOCK_MONOTONIC nanoseconds on the control pipe:
	// the local deadline, where SIGKILL lands unless it moves again.
	deadlinePrefix = "deadline "
	// startedLine on the status pipe: the command is running. Otherwise
	// the supervisor writes "CODE MESSAGE" and exits with CODE.
	startedLine = "started"
	// The control pipe's read end and the status pipe's write end in the
	// supervisor (exec.Cmd.ExtraFiles start at 3).
	controlFD = 3
	statusFD  = 4
)

// startCommand starts argv with env and the plugin's streams under a
// supervisor, and returns once the command runs. On error it returns run's
// exit code for it (126, 127, 125 when the supervisor failed).
func startCommand(argv, env []string, streams genericiooptions.IOStreams, interactive bool, grace time.Duration) (command, int, error) {
	controlR, controlW, err := os.Pipe()
	if err != nil {
		return nil, exitRunFailed, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		_, _ = controlR.Close(), controlW.Close()
		return nil, exitRunFailed, err
	}
	args := []string{superviseArg, "-grace", grace.String()}
	if interactive {
		// The command joins the plugin's process group, the terminal's
		// foreground job, as it did when the plugin ran it itself.
		args = append(args, "-pgid", strconv.Itoa(unix.Getpgrp()))
	}
	// /proc/self/exe is this very binary, even if its file was replaced
	// or removed since it started.
	cmd := exec.Command("/proc/self/exe", append(append(args, "--"), argv...)...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = streams.In, streams.Out, streams.ErrOut
	cmd.ExtraFiles = []*os.File{controlR, statusW}
	// A process group of its own: signals sent to the plugin's group (a
	// terminal's job control, a job runner stopping its job) do not reach
	// it, so it outlives the plugin to clean up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	_, _ = controlR.Close(), statusW.Close()
	if err != nil {
		_, _ = controlW.Close(), statusR.Close()
		return nil, exitRunFailed, fmt.Errorf("starting the command's supervisor: %w", err)
	}
	line, rerr := bufio.NewReader(statusR).ReadString('\n')
	_ = statusR.Close()
	if line = strings.TrimSuffix(line, "\n"); line == startedLine {
		return &supervisedCommand{cmd: cmd, control: controlW, grace: grace}, exitOK, nil
	}
	werr := cmd.Wait()
	_ = controlW.Close()
	if c, msg, ok := strings.Cut(line, " "); ok && rerr == nil {
		if code, err := strconv.Atoi(c); err == nil {
			return nil, code, errors.New(msg)
		}
	}
	return nil, exitRunFailed, fmt.Errorf("the command's supervisor failed before starting the command: %w", errors.Join(werr, rerr))
}

// Signal passes s to the supervisor, which passes it on.
func (c *supervisedCommand) Signal(s syscall.Signal) {
	_ = c.cmd.Process.Signal(s)
}

// Stop tells the supervisor to stop the command and everything it started,
// with the grace it was given.
func (c *supervisedCommand) Stop() {
	_, _ = c.control.Write([]byte(stopLine + "\n"))
}

// deadlineSlack is how far the local deadline must move before it is sent
// to the supervisor again.
const deadlineSlack = time.Millisecond

// Extend tells the supervisor the local deadline, remaining() (the time
// until the handle's Done, which comes grace early) plus grace from now,
// when it moved. The clock is read before remaining is, so the deadline
// sent is never later than the handle's.
func (c *supervisedCommand) Extend(remaining func() time.Duration) {
	now := monoNow()
	left := remaining()
	if left <= 0 {
		return // Done closes, and Stop follows
	}
	at := now + int64(left+c.grace)
	if d := at - c.sent; c.sent != 0 && d < int64(deadlineSlack) && d > -int64(deadlineSlack) {
		return
	}
	c.sent = at
	_, _ = c.control.Write([]byte(deadlinePrefix + strconv.FormatInt(at, 10) + "\n"))
}

// monoNow reads CLOCK_MONOTONIC, in nanoseconds: a clock the plugin and
// the supervisor share, which no one can set.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // CLOCK_MONOTONIC exists on every Linux
	}
	return ts.Nano()
}

// Wait waits for the supervisor, which exits with the command's exit code
// once nothing the command started runs any more.
func (c *supervisedCommand) Wait() int {
	err := c.cmd.Wait()
	_ = c.control.Close()
	if c.cmd.ProcessState == nil {
		return exitCode(nil, err)
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		// The supervisor itself was killed: what it could not stop may
		// still run (docs/run.md).
		fmt.Fprintf(c.cmd.Stderr, "kubectl-lockwarden: warning: the command's supervisor was killed (%v); processes the command started may still run\n", ws.Signal())
	}
	return exitCode(c.cmd.ProcessState, err)
}
