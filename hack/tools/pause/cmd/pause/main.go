// Command pause is the Pod sandbox of the one-node test cluster (`make
// cluster`): the process that holds each Pod's namespaces while its
// containers come and go. It does what the Kubernetes pause container does,
// in Go so that it builds from the module proxy like every other binary of
// the cluster: as PID 1 of the Pod it reaps the children its namespaces
// inherit, and it exits 0 on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
