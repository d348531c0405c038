//go:build !linux && !windows

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// newProcessGroup makes cmd the leader of a process group of its own, so
// that run's signals reach everything the command starts in that group.
func newProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends s to the process group p leads.
func signalGroup(p *os.Process, s syscall.Signal) error {
	return syscall.Kill(-p.Pid, s)
}
