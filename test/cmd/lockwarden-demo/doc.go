// Command lockwarden-demo plays the paused-holder story on a local control
// plane, end to end, with real processes:
//
//  1. worker A takes a 10-second lease on invoice-batch/2026-07-19 (fence 1),
//     writes the guarded ConfigMap, and starts computing;
//  2. the demo freezes A with SIGSTOP, as a long GC pause or a stalled VM
//     would, and keeps it frozen past the end of its lease;
//  3. the controller expires A's grant and grants worker B fence 2; B writes
//     the correct total and releases;
//  4. the demo resumes A with SIGCONT. A still believes it holds the lock and
//     writes its stale total with fence 1: admission refuses it with
//     STALE_OWNER, so B's result survives.
//
// The point it shows: the lock service deciding that A's lease is over is not
// enough; the write itself must carry the fencing token and the resource side
// (here the guarded-write admission webhook) must check it. The guarantee is
// only as strong as that enforcement point: a write that bypasses it, or a
// downstream system that cannot check a fence, is not protected.
//
// Usage (what `make demo` runs, from the repository root):
//
//	bin/lockwarden-demo --assets bin --manager bin/manager
//
// It starts etcd and kube-apiserver with envtest (binaries from --assets),
// installs config/local with kubectl, runs bin/manager as a separate process
// (its log goes to a file whose path is printed), creates the billing
// namespace with two service-account identities, and re-executes itself as
// the hidden `worker` subcommand for A and B. Workers report to the demo
// with one JSON object per line on stdout and take no commands but signals.
// Everything it started is stopped on success, on failure and on Ctrl-C.
// It exits 0 only if A's late write was refused with STALE_OWNER and the
// ConfigMap holds B's result.
package main
