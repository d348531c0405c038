package envtest

import "go.uber.org/goleak"

// FindLeaks reports goroutines left running once a suite's control plane
// has stopped, other than those client-go, klog and controller-runtime keep
// for the life of the process. A suite calls it at the end of TestMain: no
// handle's loop, watch or request of the code under test may outlive it.
func FindLeaks() error {
	return goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.BackoffUntil"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("sigs.k8s.io/controller-runtime/pkg/log.(*loggerPromise).Fulfill"),
	)
}
