// Command lockwarden-netns-forward makes the test cluster's API server
// (`make cluster`), which listens inside the cluster's own network
// namespace, reachable from the host: it listens on a host address and
// forwards every connection to an address inside the namespace. Nothing of
// the cluster's network is joined to the host's, so nothing leaks and
// several clusters cannot collide; this one TCP port is the only way in.
//
// The listening socket is opened in the host's namespace; the connections
// out are opened on one OS thread that entered the cluster's namespace
// (setns(2) acts on the calling thread only), and a socket keeps the
// namespace it was opened in.
//
//	lockwarden-netns-forward -netns /run/netns/lw-1a2b3c4d -to 10.250.0.1:6443 \
//	    -listen 127.0.0.1:0 -port-file .tmp/cluster/apiserver.port
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	netns := flag.String("netns", "", "Network namespace to forward into: a path such as /run/netns/NAME (required).")
	to := flag.String("to", "", "Address inside the namespace to forward to, host:port (required).")
	listen := flag.String("listen", "127.0.0.1:0", "Host address to listen on; port 0 picks a free one.")
	portFile := flag.String("port-file", "", "File to write the port listened on to, once listening.")
	flag.Parse()
	if err := run(*netns, *to, *listen, *portFile); err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden-netns-forward:", err)
		os.Exit(1)
	}
}

func run(netns, to, listen, portFile string) error {
	if netns == "" || to == "" {
		return errors.New("-netns and -to are required")
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	dial, err := dialer(netns, to)
	if err != nil {
		return err
	}
	if portFile != "" {
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		if err := os.WriteFile(portFile+".tmp", []byte(port+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(portFile+".tmp", portFile); err != nil {
			return err
		}
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		_ = l.Close()
	}()
	for {
		in, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go forward(in, dial)
	}
}

// dialer returns a function that connects to addr inside the network
// namespace at path: every connection is opened by one goroutine locked to
// an OS thread that entered that namespace.
func dialer(path, addr string) (func() (net.Conn, error), error) {
	type result struct {
		c   net.Conn
		err error
	}
	requests := make(chan chan result)
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine's namespace
		f, err := os.Open(path)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			_ = f.Close()
		}
		ready <- err
		if err != nil {
			return
		}
		for reply := range requests {
			c, err := net.Dial("tcp", addr)
			reply <- result{c, err}
		}
	}()
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("entering %s: %w", path, err)
	}
	return func() (net.Conn, error) {
		reply := make(chan result, 1)
		requests <- reply
		r := <-reply
		return r.c, r.err
	}, nil
}

// forward copies both ways between in and a new connection into the
// namespace until either side closes.
func forward(in net.Conn, dial func() (net.Conn, error)) {
	defer in.Close()
	out, err := dial()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden-netns-forward: dialing:", err)
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}
