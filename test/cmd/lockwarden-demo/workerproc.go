package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

// stepTimeout bounds each wait for a worker's report.
const stepTimeout = 30 * time.Second

// workerProc is a worker running as a child process: the demo reads its
// reports and sends it signals, nothing else.
type workerProc struct {
	actor   string
	cmd     *exec.Cmd
	logPath string
	// events carries the worker's reports, in order; closed at the end of
	// its stdout. Every report is also on the timeline.
	events chan Event
	// exited is closed when the process has exited; err is then its exit
	// status.
	exited chan struct{}
	err    error
}

// startWorker runs `self worker --actor actor --kubeconfig kubeconfig args...`,
// with its stderr and any non-JSON output in logPath.
func startWorker(self, actor, kubeconfig, logPath string, tl *timeline, args ...string) (*workerProc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &workerProc{
		actor:   actor,
		logPath: logPath,
		events:  make(chan Event, 64),
		exited:  make(chan struct{}),
	}
	p.cmd = exec.Command(self, append([]string{workerCommand, "--actor", actor, "--kubeconfig", kubeconfig}, args...)...)
	p.cmd.Stderr = logFile
	// Its own process group: only the demo signals it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting worker %s: %w", actor, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				fmt.Fprintf(logFile, "stdout: %s\n", sc.Bytes())
				continue
			}
			tl.addEvent(ev)
			p.events <- ev
		}
		close(p.events)
		p.err = p.cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	return p, nil
}

// await returns the worker's next report whose kind is one of kinds,
// skipping others. It fails if the worker reports a failure, exits first,
// or takes longer than stepTimeout.
func (p *workerProc) await(ctx context.Context, kinds ...string) (Event, error) {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	want := strings.Join(kinds, " or ")
	for {
		select {
		case <-ctx.Done():
			return Event{}, fmt.Errorf("waiting for worker %s to report %s: %w (log: %s)", p.actor, want, ctx.Err(), p.logPath)
		case ev, ok := <-p.events:
			switch {
			case !ok:
				<-p.exited
				return Event{}, fmt.Errorf("worker %s exited (%w) before reporting %s (log: %s)", p.actor, p.err, want, p.logPath)
			case ev.Event == EventFailed:
				return ev, fmt.Errorf("worker %s failed: %s", p.actor, ev.Detail)
			case slices.Contains(kinds, ev.Event):
				return ev, nil
			}
		}
	}
}

// wait waits for the worker to exit, and returns an error unless it exited 0.
func (p *workerProc) wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for worker %s to exit: %w", p.actor, ctx.Err())
		case _, ok := <-p.events:
			if ok {
				continue // already on the timeline
			}
			<-p.exited
			if p.err != nil {
				return fmt.Errorf("worker %s: %w (log: %s)", p.actor, p.err, p.logPath)
			}
			return nil
		}
	}
}

// freeze stops the worker dead (SIGSTOP): no code of it runs until resume.
func (p *workerProc) freeze() error {
	return p.cmd.Process.Signal(syscall.SIGSTOP)
}

// resume lets a frozen worker go on (SIGCONT).
func (p *workerProc) resume() error {
	return p.cmd.Process.Signal(syscall.SIGCONT)
}

// stop ends the worker if it still runs: SIGCONT, so that a frozen worker
// can die, then SIGKILL.
func (p *workerProc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	go func() {
		for range p.events {
		}
	}()
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		fmt.Fprintf(os.Stderr, "warning: worker %s (pid %d) did not exit after SIGKILL\n", p.actor, p.cmd.Process.Pid)
	}
}
