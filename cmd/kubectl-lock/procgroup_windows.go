//go:build windows

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// newProcessGroup does nothing on Windows, which has no process groups to
// signal.
func newProcessGroup(*exec.Cmd) {}

// signalGroup on Windows can only kill the command itself: there is no
// SIGTERM, so a command under run is killed at the grace deadline.
func signalGroup(p *os.Process, s syscall.Signal) error {
	if s == syscall.SIGKILL {
		return p.Kill()
	}
	return p.Signal(s)
}
