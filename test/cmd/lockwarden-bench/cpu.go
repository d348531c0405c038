package main

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times (100 on
// every Linux platform Go supports).
const clockTicks = 100

// cpuMeter reads the CPU time (user + system) of the processes of a run:
// kube-apiserver, etcd, the manager and the bench itself (all clients).
type cpuMeter struct {
	pids map[string]int
}

// Process names, as the CPU table shows them.
var cpuProcs = []string{"kube-apiserver", "etcd", "manager", "bench (all clients)"}

// newCPUMeter finds the control plane's processes by the addresses they
// serve on; the manager's pid is read at each sample, as it restarts.
func newCPUMeter(cp *controlPlane) *cpuMeter {
	m := &cpuMeter{pids: map[string]int{"bench (all clients)": os.Getpid()}}
	if u, err := url.Parse(cp.etcdURL); err == nil {
		m.pids["etcd"] = findPID("etcd", "--listen-client-urls="+u.String())
	}
	if u, err := url.Parse(cp.adminConfig.Host); err == nil {
		m.pids["kube-apiserver"] = findPID("kube-apiserver", "--secure-port="+u.Port())
	}
	return m
}

// findPID returns the pid of a process named name whose command line has
// arg, or 0.
func findPID(name, arg string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) != name {
			continue
		}
		for _, a := range args {
			if a == arg {
				pid, _ := strconv.Atoi(filepath.Base(d))
				return pid
			}
		}
	}
	return 0
}

// cpuSeconds is the CPU time a process has used so far.
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after it are
	// space-separated: utime and stime are fields 14 and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / clockTicks
}

// sample returns the CPU seconds used so far by each process.
func (m *cpuMeter) sample(mgr *managerProc) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range m.pids {
		out[name] = cpuSeconds(pid)
	}
	if mgr != nil {
		out["manager"] = mgr.cpuSeconds()
	}
	return out
}

// cpuRow is the CPU each process spent per operation of one measurement.
type cpuRow struct {
	what  string
	perOp map[string]float64 // ms of CPU per operation, by process
}

func cpuPerOp(what string, before, after map[string]float64, ops int) cpuRow {
	r := cpuRow{what: what, perOp: map[string]float64{}}
	for _, p := range cpuProcs {
		if ops > 0 {
			r.perOp[p] = 1000 * (after[p] - before[p]) / float64(ops)
		}
	}
	return r
}

// total is the CPU per operation of every process.
func (r cpuRow) total() float64 {
	t := 0.0
	for _, p := range cpuProcs {
		t += r.perOp[p]
	}
	return t
}

func cpuMarkdown(rows []cpuRow) string {
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("### CPU per operation\n\nCPU time (user + system, from /proc/<pid>/stat) each process spent per operation, in ms. The bench process runs every client of every system, including their watches.\n\n")
	b.WriteString("| measurement |")
	for _, p := range cpuProcs {
		b.WriteString(" " + p + " |")
	}
	b.WriteString(" total |\n| --- |")
	for range cpuProcs {
		b.WriteString(" ---: |")
	}
	b.WriteString(" ---: |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s |", r.what)
		total := 0.0
		for _, p := range cpuProcs {
			fmt.Fprintf(&b, " %.2f |", r.perOp[p])
			total += r.perOp[p]
		}
		fmt.Fprintf(&b, " %.2f |\n", total)
	}
	return b.String() + "\n"
}
