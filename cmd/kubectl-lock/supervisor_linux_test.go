package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// The test binary is also the supervisor (run re-executes its own binary)
// and, for the tests where the plugin dies, the plugin.
func TestMain(m *testing.M) {
	if code, ok := asSupervisor(os.Args[1:]); ok {
		os.Exit(code)
	}
	if os.Getenv(pluginEnv) != "" {
		os.Exit(playPlugin(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// pluginEnv set makes the test binary play the plugin (playPlugin).
const pluginEnv = "LOCKWARDEN_TEST_PLAY_PLUGIN"

// playPlugin starts argv as run does and stops it when a line "stop"
// arrives on stdin: a plugin whose lock is lost, or that a test kills. It
// prints "running" once the command runs.
func playPlugin(argv []string) int {
	grace, _ := time.ParseDuration(os.Getenv("GRACE"))
	c, code, err := startCommand(argv, os.Environ(), genericiooptions.IOStreams{In: os.Stdin, Out: os.Stderr, ErrOut: os.Stderr}, isTerminal(os.Stdin), grace)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return code
	}
	fmt.Println("running")
	go func() {
		if line, _ := bufio.NewReader(os.Stdin).ReadString('\n'); line == "stop\n" {
			c.Stop()
		}
	}()
	return c.Wait()
}

// Commands that leave the command's process group, as daemons do. Every
// process has $MARK in its environment; the one that leaves creates
// $DIR/up once it runs, and logs a SIGTERM it gets to $DIR/term.
const (
	// setsidChild: a descendant in a session of its own.
	setsidChild = `setsid sh -c 'trap "echo setsid >> \"$DIR/term\"" TERM; touch "$DIR/up"; while :; do sleep 0.1; done' & sleep 1000`
	// doubleForkChild: a grandchild whose parent exits at once, in a
	// process group of its own (fork, setpgid, fork).
	doubleForkChild = `( perl -e 'setpgrp(0, 0); open(F, ">", "$ENV{DIR}/up") and close(F); exec qw(sleep 1000) or die' & ) ; sleep 1000`
	// everyChild: both, under a command that ignores SIGTERM.
	everyChild = `trap '' TERM
setsid sh -c 'while :; do sleep 0.1; done' &
( perl -e 'setpgrp(0, 0); open(F, ">", "$ENV{DIR}/up") and close(F); exec qw(sleep 1000) or die' & )
while :; do sleep 0.1; done`
)

// tree is one test's command tree: its marker and directory.
type tree struct {
	mark, dir string
}

func newTree(t *testing.T) tree {
	return tree{mark: fmt.Sprintf("lockwarden-tree-%d-%s", os.Getpid(), strings.NewReplacer("/", "-").Replace(t.Name())), dir: t.TempDir()}
}

// env is the environment run gives the command, with the marker.
func (tr tree) env() []string {
	return append(os.Environ(), "MARK="+tr.mark, "DIR="+tr.dir)
}

// running lists the live processes that carry the marker in their
// environment (zombies have none), leaving out the pids in except.
func (tr tree) running(except ...int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || containsInt(except, pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && bytes.Contains(b, []byte("MARK="+tr.mark+"\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// cleanup kills whatever a failed test left running.
func (tr tree) cleanup(t *testing.T) {
	t.Cleanup(func() {
		for _, pid := range tr.running() {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	})
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// within polls cond every 20 ms until it holds, failing after d.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, d, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("never within %s: %s", d, what)
	}
}

// settle is how much later than its deadline the tests accept a process's
// end, for a machine under load.
const settle = 3 * time.Second

// startTree starts script as run does, with the test binary as the
// plugin, and waits until $DIR/up exists.
func startTree(t *testing.T, tr tree, script string, grace time.Duration) command {
	t.Helper()
	tr.cleanup(t)
	c, _, err := startCommand([]string{"sh", "-c", script}, tr.env(), genericiooptions.IOStreams{Out: os.Stderr, ErrOut: os.Stderr}, false, grace)
	if err != nil {
		t.Fatal(err)
	}
	tr.awaitUp(t)
	return c
}

// awaitUp waits until $DIR/up exists.
func (tr tree) awaitUp(t *testing.T) {
	t.Helper()
	within(t, 10*time.Second, "the command's descendant runs", func() bool {
		_, err := os.Stat(filepath.Join(tr.dir, "up"))
		return err == nil
	})
}

// When the lock is lost, the command and everything it started get
// SIGTERM and, after the grace, SIGKILL: also a descendant in a session of
// its own and a daemon-style grandchild in a group of its own.
func TestSupervisorStopsEveryDescendantWhenTheLockIsLost(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"setsid", setsidChild},
		{"double fork", doubleForkChild},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			grace := 2 * time.Second
			c := startTree(t, tr, tc.script, grace)
			lost := time.Now()
			c.Stop()
			waited := make(chan int, 1)
			go func() { waited <- c.Wait() }()
			select {
			case <-waited:
			case <-time.After(grace + settle):
				t.Fatalf("run still waits for the command %s after the lock was lost (grace %s); running: %v", time.Since(lost), grace, tr.running())
			}
			if left := tr.running(); len(left) > 0 {
				t.Fatalf("processes %v still run after the command was stopped", left)
			}
			if tc.name == "setsid" && !fileContains(filepath.Join(tr.dir, "term"), "setsid") {
				t.Errorf("the setsid'ed descendant was killed without SIGTERM first")
			}
		})
	}
}

// When the plugin itself dies, by SIGKILL or by SIGQUIT (the Go runtime's
// dump and exit), the supervisor kills everything the command started at
// once: how long the lease still runs died with the plugin.
func TestSupervisorKillsEverythingWhenThePluginDies(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			tr := newTree(t)
			tr.cleanup(t)
			plugin := exec.Command("/proc/self/exe", "sh", "-c", everyChild)
			plugin.Env = append(tr.env(), pluginEnv+"=1", "GRACE=10s")
			out, err := plugin.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			// A file, not a pipe that survivors would hold open.
			stderr, err := os.Create(filepath.Join(tr.dir, "stderr"))
			if err != nil {
				t.Fatal(err)
			}
			defer stderr.Close()
			plugin.Stderr = stderr
			if _, err := plugin.StdinPipe(); err != nil {
				t.Fatal(err)
			}
			if err := plugin.Start(); err != nil {
				t.Fatal(err)
			}
			if line, err := bufio.NewReader(out).ReadString('\n'); line != "running\n" {
				t.Fatalf("the plugin said %q (%v):\n%s", line, err, readFile(stderr.Name()))
			}
			tr.awaitUp(t)
			t.Logf("running: %v", tr.running())
			if err := plugin.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			_ = plugin.Wait()
			within(t, settle, "nothing the command started runs", func() bool { return len(tr.running()) == 0 })
			t.Logf("everything gone %s after the plugin got %s", time.Since(killed), sig)
		})
	}
}

// A command that ignores SIGTERM runs until the grace is over, not longer.
func TestSupervisorKillsAfterTheGrace(t *testing.T) {
	tr := newTree(t)
	grace := 2 * time.Second
	c := startTree(t, tr, `trap '' TERM; touch "$DIR/up"; while :; do sleep 0.1; done`, grace)
	c.Stop()
	lost := time.Now()
	waited := make(chan int, 1)
	go func() { waited <- c.Wait() }()
	select {
	case <-waited:
		t.Fatalf("the command ended %s after SIGTERM, before its %s grace", time.Since(lost), grace)
	case <-time.After(grace / 2):
	}
	select {
	case code := <-waited:
		if code != 128+int(syscall.SIGKILL) {
			t.Errorf("exit code %d, want 137 (SIGKILL)", code)
		}
	case <-time.After(grace + settle):
		t.Fatalf("the command still runs %s after SIGTERM (grace %s)", time.Since(lost), grace)
	}
}

// When the command exits, what it left running is stopped before run
// releases the lock, and run exits with the command's exit code.
func TestSupervisorStopsWhatTheCommandLeft(t *testing.T) {
	tr := newTree(t)
	tr.cleanup(t)
	c, _, err := startCommand([]string{"sh", "-c", `setsid sh -c 'trap "echo left >> \"$DIR/term\"" TERM; touch "$DIR/up"; while :; do sleep 0.1; done' &
while [ ! -e "$DIR/up" ]; do sleep 0.05; done; exit 3`},
		tr.env(), genericiooptions.IOStreams{Out: os.Stderr, ErrOut: os.Stderr}, false, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(); code != 3 {
		t.Errorf("exit code %d, want the command's 3", code)
	}
	if left := tr.running(); len(left) > 0 {
		t.Fatalf("processes %v still run after run's command exited", left)
	}
	if !fileContains(filepath.Join(tr.dir, "term"), "left") {
		t.Errorf("what the command left running was killed without SIGTERM first")
	}
}

// run's exit codes stay the command's own, and those for a command that
// cannot be run.
func TestSupervisorExitCodes(t *testing.T) {
	dir := t.TempDir()
	notExecutable := filepath.Join(dir, "script")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		argv    []string
		code    int
		message string
	}{
		{[]string{"sh", "-c", "exit 7"}, 7, ""},
		{[]string{"sh", "-c", "kill -TERM $$"}, 128 + int(syscall.SIGTERM), ""},
		{[]string{"lockwarden-no-such-command"}, exitNotFound, "executable file not found"},
		{[]string{notExecutable}, exitCannotExec, "permission denied"},
	} {
		c, code, err := startCommand(tc.argv, os.Environ(), genericiooptions.IOStreams{Out: os.Stderr, ErrOut: os.Stderr}, false, time.Second)
		if err == nil {
			code = c.Wait()
		}
		if code != tc.code || (tc.message == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.message)) {
			t.Errorf("%q: exit code %d, error %v; want %d, %q", tc.argv, code, err, tc.code, tc.message)
		}
	}
}

// Signals run passes on reach the command's process group; an interactive
// command stays in the plugin's process group, the terminal's job.
func TestSupervisorSignalsAndGroups(t *testing.T) {
	if signal.Ignored(syscall.SIGHUP) {
		// Under nohup the command inherits SIGHUP ignored, and a shell
		// cannot trap a signal ignored on entry (POSIX trap): the test's
		// shells would never see the SIGHUP passed on to them.
		t.Skip("SIGHUP is ignored in this process (started under nohup): the command's shells cannot trap it")
	}
	tr := newTree(t)
	tr.cleanup(t)
	streams := genericiooptions.IOStreams{Out: os.Stderr, ErrOut: os.Stderr}
	c, _, err := startCommand([]string{"sh", "-c", `trap 'echo parent >> "$DIR/hup"; wait; exit 5' HUP
sh -c 'trap "echo child >> \"$DIR/hup\"; exit 0" HUP; touch "$DIR/up"; while :; do sleep 0.1; done' &
while :; do sleep 0.1; done`}, tr.env(), streams, false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tr.awaitUp(t)
	c.Signal(syscall.SIGHUP)
	if code := c.Wait(); code != 5 || !fileContains(filepath.Join(tr.dir, "hup"), "child") || !fileContains(filepath.Join(tr.dir, "hup"), "parent") {
		t.Errorf("after SIGHUP: exit code %d (want 5), the group's log %q", code, readFile(filepath.Join(tr.dir, "hup")))
	}

	pgid := filepath.Join(tr.dir, "pgid")
	c, _, err = startCommand([]string{"sh", "-c", `cut -d' ' -f5 /proc/$$/stat > "$1"`, "sh", pgid}, tr.env(), streams, true, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := c.Wait(); code != 0 || strings.TrimSpace(readFile(pgid)) != strconv.Itoa(unix.Getpgrp()) {
		t.Errorf("an interactive command ran in process group %q (exit code %d), want the plugin's %d", readFile(pgid), code, unix.Getpgrp())
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func fileContains(path, s string) bool { return strings.Contains(readFile(path), s) }

// heartbeatChild ignores SIGTERM, logs it to $DIR/term, and writes the
// time (nanoseconds since the epoch) to $DIR/alive every 20 ms until it is
// killed.
const heartbeatChild = `trap 'echo term >> "$DIR/term"' TERM
while :; do date +%s%N > "$DIR/alive.tmp"; mv "$DIR/alive.tmp" "$DIR/alive"; touch "$DIR/up"; sleep 0.02; done`

// lastAlive is the command's last heartbeat (heartbeatChild).
func (tr tree) lastAlive(t *testing.T) time.Time {
	t.Helper()
	ns, err := strconv.ParseInt(strings.TrimSpace(readFile(filepath.Join(tr.dir, "alive"))), 10, 64)
	if err != nil {
		t.Fatalf("the command's last heartbeat: %v", err)
	}
	return time.Unix(0, ns)
}

// A plugin that sent its local deadline and then says nothing more (it is
// frozen, or starved) still has its command killed at that deadline, by
// the supervisor alone: SIGTERM the grace before it, SIGKILL at it. A
// deadline moved in time keeps the command running.
func TestSupervisorStopsAtTheDeadlineUnlessMoved(t *testing.T) {
	tr := newTree(t)
	grace := time.Second
	c := startTree(t, tr, heartbeatChild, grace)
	waited := make(chan int, 1)
	go func() { waited <- c.Wait() }()

	c.Extend(func() time.Duration { return time.Second })
	first := time.Now().Add(time.Second + grace) // SIGKILL at the latest
	within(t, 2*time.Second, "a moved deadline is sent", func() bool {
		// Moved before SIGTERM was due: the first deadline no longer counts.
		c.Extend(func() time.Duration { return 2 * time.Second })
		return true
	})
	moved := time.Now().Add(2*time.Second + grace)
	within(t, 10*time.Second, "the command gets SIGTERM", func() bool { return fileContains(filepath.Join(tr.dir, "term"), "term") })
	select {
	case code := <-waited:
		if code != 128+int(syscall.SIGKILL) {
			t.Errorf("exit code %d, want 137 (SIGKILL)", code)
		}
	case <-time.After(2*time.Second + grace + settle):
		t.Fatalf("the command still runs %s after its deadline", time.Since(moved))
	}
	last := tr.lastAlive(t)
	t.Logf("last heartbeat %s after the first deadline, %s before the moved one", last.Sub(first), moved.Sub(last))
	if !last.After(first) {
		t.Errorf("the command was killed at the first deadline, though the plugin moved it")
	}
	if !last.Before(moved) {
		t.Errorf("the command ran %s past the local deadline", last.Sub(moved))
	}
	if left := tr.running(); len(left) > 0 {
		t.Fatalf("processes %v still run after the deadline", left)
	}
}

// A stop that arrives late (the plugin was slow to tell the supervisor)
// does not push SIGKILL past the local deadline: the grace counts back
// from the deadline, not from when the stop was read.
func TestSupervisorStopKillsAtTheDeadline(t *testing.T) {
	tr := newTree(t)
	grace := 2 * time.Second
	c := startTree(t, tr, heartbeatChild, grace)
	waited := make(chan int, 1)
	go func() { waited <- c.Wait() }()
	c.Extend(func() time.Duration { return 300 * time.Millisecond })
	deadline := time.Now().Add(300*time.Millisecond + grace)
	<-time.After(time.Second) // the plugin is late with its stop
	c.Stop()
	select {
	case <-waited:
	case <-time.After(grace + settle):
		t.Fatalf("the command still runs %s after its deadline", time.Since(deadline))
	}
	last := tr.lastAlive(t)
	t.Logf("last heartbeat %s before the local deadline", deadline.Sub(last))
	if !last.Before(deadline) {
		t.Errorf("the command ran %s past the local deadline: its SIGKILL counted the grace from the late stop", last.Sub(deadline))
	}
}
