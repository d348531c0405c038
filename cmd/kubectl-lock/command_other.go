//go:build !linux

package main

import (
	"os/exec"
	"sync"
	"syscall"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// directCommand is COMMAND as a direct child of the plugin, where no
// supervisor can follow what it starts (macOS, the BSDs, Windows; see
// docs/run.md): unless it is interactive it leads a process group of its
// own, and signals and the stop reach that group. A descendant that leaves
// the group, and the command itself when the plugin dies, are out of its
// reach.
type directCommand struct {
	cmd         *exec.Cmd
	interactive bool
	grace       time.Duration

	mu   sync.Mutex
	kill *time.Timer
}

// startCommand starts argv with env and the plugin's streams. On error it
// returns run's exit code for it (126, 127).
func startCommand(argv, env []string, streams genericiooptions.IOStreams, interactive bool, grace time.Duration) (command, int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = streams.In, streams.Out, streams.ErrOut
	cmd.Env = env
	if !interactive {
		newProcessGroup(cmd)
	}
	if err := cmd.Start(); err != nil {
		return nil, startErrorCode(err), err
	}
	return &directCommand{cmd: cmd, interactive: interactive, grace: grace}, exitOK, nil
}

func (c *directCommand) Signal(s syscall.Signal) {
	if c.interactive {
		_ = c.cmd.Process.Signal(s)
	} else {
		_ = signalGroup(c.cmd.Process, s)
	}
}

// Extend does nothing: without a supervisor, the plugin stops the command
// itself when Done closes.
func (c *directCommand) Extend(func() time.Duration) {}

func (c *directCommand) Stop() {
	c.Signal(syscall.SIGTERM)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kill == nil {
		c.kill = time.AfterFunc(c.grace, func() { c.Signal(syscall.SIGKILL) })
	}
}

func (c *directCommand) Wait() int {
	err := c.cmd.Wait()
	c.mu.Lock()
	if c.kill != nil {
		c.kill.Stop()
	}
	c.mu.Unlock()
	return exitCode(c.cmd.ProcessState, err)
}

// asSupervisor returns 0, false: only Linux runs the command under a
// supervisor.
func asSupervisor([]string) (int, bool) { return 0, false }
