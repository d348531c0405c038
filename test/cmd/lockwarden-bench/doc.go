// Command lockwarden-bench measures lockwarden side by side with the locks
// users would otherwise pick, in one run, on one local control plane, so
// that the machine's noise cancels out in the ratios:
//
//   - go.etcd.io/etcd/client/v3/concurrency's Mutex against the same etcd
//     the API server stores in (the storage floor);
//   - a minimal Lease-as-lock through the same API server: compare-and-swap
//     on spec.holderIdentity with a resourceVersion precondition, the waiter
//     watching the Lease (the floor of any API-server-mediated lock);
//   - client-go tools/leaderelection with ReleaseOnCancel, at
//     1s/800ms/100ms and at its defaults 15s/10s/2s.
//
// It starts etcd and kube-apiserver with envtest (binaries from --assets),
// installs config/local with kubectl (its webhook URLs moved to a free
// port), runs the real manager binary as a child process, and then measures
// in order: the raw floors (etcd Put, API-server Update), handoff latency
// (the holder's release call to the waiter observing itself holding,
// through its own watch), expiry handoff (the holder vanishes; its
// expiresAt to the successor holding), acquire+release cycle throughput on
// 1 and 64 resources, cycle throughput on one resource with 1, 4 and 16
// permits (2N workers each; a table of its own, no target), guarded-write
// admission overhead, and scale (many
// live grants: controller RSS, request-to-Held lag on a free resource, and
// what is left after the finished-grant retention; the manager is
// restarted with a short --finished-grant-retention for this phase).
//
// Besides the table it explains lockwarden's numbers: a lockwarden handoff
// series with 8 waiters in line; a traced series whose every handoff is
// bracketed by scrapes of the API server's and the manager's metrics
// (requests by verb and resource, webhook calls, storage operations, watch
// events, reconciles) and timed step by step through an extra watch; and
// the CPU time kube-apiserver, etcd, the manager and the clients spend per
// operation (/proc/<pid>/stat).
//
// Every client is its own connection inside this process (one TCP or gRPC
// connection each, as a separate process would have), authenticated as the
// admin; every process it starts (etcd, kube-apiserver, manager) is stopped
// on success, on failure and on Ctrl-C. Traffic stays on 127.0.0.1.
//
// Output: a markdown table on stdout and, in --out/<UTC timestamp>/,
// results.md (table, targets, notes, CPU and handoff-path breakdown,
// machine), samples.csv (every sample), handoff.png and expiry.png (latency
// distributions), traced-metrics.txt and the logs. Measured figures depend
// on the machine and on what else runs on it: compare ratios within one
// run, not figures across runs.
//
// Usage (what `make bench` runs, from the repository root):
//
//	bin/lockwarden-bench --assets bin --manager bin/manager [--quick] [--phases handoff,traced]
package main
