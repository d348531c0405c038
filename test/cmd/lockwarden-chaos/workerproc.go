package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// workerStopGrace is how long a worker has, after SIGTERM, to release its
// grant and exit.
const workerStopGrace = 20 * time.Second

// workerProc is a worker running as a child process: the driver sends it
// signals, nothing else; it reports through its history file.
type workerProc struct {
	index   int
	logPath string
	history string
	proc    *process

	mu     sync.Mutex
	frozen bool
}

// process is a running child process.
type process struct {
	cmd *exec.Cmd
	// exited is closed when the process has exited; err is then its status.
	exited chan struct{}
	err    error
}

func (p *process) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// startWorkerProc runs `self worker ...` for worker i.
func startWorkerProc(self string, i int, kubeconfig, dir string, o options, resources []string) (*workerProc, error) {
	name := workerName(i)
	wp := &workerProc{
		index:   i,
		logPath: filepath.Join(dir, name+".log"),
		history: filepath.Join(dir, "parts", name+".jsonl"),
	}
	logFile, err := os.Create(wp.logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, workerCommand,
		"--id", name,
		"--kubeconfig", kubeconfig,
		"--namespace", chaosNamespace,
		"--history", wp.history,
		"--resources", strings.Join(resources, ","),
		"--ttl", o.ttl.String(),
		"--seed", strconv.FormatUint(o.seed+uint64(i)+1, 10),
		"--replica-of", replicaOf(i, o.workers),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group: only the driver signals it. It is killed if
	// the driver dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	wp.proc = &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		wp.proc.err = cmd.Wait()
		logFile.Close()
		close(wp.proc.exited)
	}()
	return wp, nil
}

func (wp *workerProc) name() string { return workerName(wp.index) }

// freeze stops the worker dead (SIGSTOP): no code of it runs, its clocks go
// on. It reports false if the worker is already frozen or gone.
func (wp *workerProc) freeze() bool {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if wp.frozen || wp.proc.done() {
		return false
	}
	if wp.proc.cmd.Process.Signal(syscall.SIGSTOP) != nil {
		return false
	}
	wp.frozen = true
	return true
}

// thaw lets a frozen worker go on (SIGCONT).
func (wp *workerProc) thaw() {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if wp.frozen {
		_ = wp.proc.cmd.Process.Signal(syscall.SIGCONT)
		wp.frozen = false
	}
}

// arm asks the worker to stop itself before its next write (SIGUSR1).
func (wp *workerProc) arm() bool {
	return !wp.proc.done() && wp.proc.cmd.Process.Signal(syscall.SIGUSR1) == nil
}

// disarm takes the request back (SIGUSR2).
func (wp *workerProc) disarm() {
	if !wp.proc.done() {
		_ = wp.proc.cmd.Process.Signal(syscall.SIGUSR2)
	}
}

// selfStopped reports whether the worker has stopped itself (state T in
// /proc/PID/stat), and marks it frozen if so, so thaw resumes it.
func (wp *workerProc) selfStopped() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", wp.proc.cmd.Process.Pid))
	if err != nil {
		return false
	}
	// "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
		return false
	}
	wp.mu.Lock()
	defer wp.mu.Unlock()
	wp.frozen = true
	return true
}

// stop asks the worker to release what it holds and exit (SIGCONT, then
// SIGTERM), kills it after workerStopGrace, and says how it ended.
func (wp *workerProc) stop() string {
	wp.thaw()
	if wp.proc.done() {
		return fmt.Sprintf("had exited (%v)", wp.proc.err)
	}
	wp.disarm()
	_ = wp.proc.cmd.Process.Signal(syscall.SIGTERM)
	grace := time.NewTimer(workerStopGrace)
	defer grace.Stop()
	// A worker that stopped itself just before SIGTERM was handled is
	// resumed again.
	cont := time.NewTicker(500 * time.Millisecond)
	defer cont.Stop()
	for {
		select {
		case <-wp.proc.exited:
			if wp.proc.err != nil {
				return fmt.Sprintf("stopped (%v)", wp.proc.err)
			}
			return "stopped"
		case <-cont.C:
			_ = wp.proc.cmd.Process.Signal(syscall.SIGCONT)
		case <-grace.C:
			_ = wp.proc.cmd.Process.Kill()
			<-wp.proc.exited
			return fmt.Sprintf("killed after %s", workerStopGrace)
		}
	}
}
