// Command lockwarden-chaos is lockwarden's real-process chaos suite: the
// second half of the release gate (the first is the deterministic
// simulation, cmd/lockwarden-faults). It runs the real manager, the real
// admission webhooks and real worker processes on a local control plane,
// injects faults into all of them, records every operation with its
// invocation and completion time, and checks the recorded history.
//
// Usage (what `make chaos DURATION=5m` runs, from the repository root):
//
//	bin/lockwarden-chaos --assets bin --manager bin/manager --duration 5m
//	bin/lockwarden-chaos check --history /tmp/lockwarden-chaos-*/history.jsonl
//
// # The system under test
//
//   - etcd and kube-apiserver from --assets, started by envtest, with the
//     CRDs and config/local applied by kubectl (internal/localcp; webhook
//     URLs moved from localhost:9443 to a free port, so a demo or another
//     test may run beside it);
//   - two manager replicas (bin/manager processes) with --leader-elect and
//     --grants-on-every-replica in lockwarden-system: both grant, renew and
//     expire (each resource first by its preferred replica, the other
//     taking over after --takeover-delay), and the leader also keeps the
//     issuer's keys. Each reaches the API server through its own toxiproxy
//     proxy. Both serve the webhooks; a small TCP balancer on the webhook
//     URL's port behaves as a Service with a readiness probe: it probes
//     each replica's /readyz every 200 ms, sends a new connection only to a
//     ready replica (none ready: the connection is refused, fail closed),
//     and closes the connections of a replica that fails its probe;
//   - worker processes (this binary re-executed as the hidden `worker`
//     subcommand), each with an envtest client certificate for
//     system:serviceaccount:chaos:worker-N, except worker-1, which runs as
//     worker-0's service account: two replicas of one Deployment, whose
//     writes only the claim each asserts tells apart. They contend for
//     a few resources with the shipped holder library, pkg/lock, as a
//     user's program does: lock.Client.Acquire makes the LockGrant, the
//     Handle keeps it (renewing in the background, and closing Done once
//     ownership is unknown or lost), and Release gives it back. Under it
//     they write fenced increments to the guarded ConfigMap of the
//     resource: read the count, add one, stamp the write with Handle.Stamp
//     (the grant, fence and proof: the claim, which admission consumes,
//     recording what it accepted in the accepted-* annotations) and write
//     it back with a resourceVersion precondition. What a worker believed
//     and when (its renewals, OWNERSHIP_UNKNOWN with the local deadline,
//     Done) comes from the handle's trace (lock.WithTrace). Each worker
//     reaches the API server through its own toxiproxy proxy
//     (github.com/Shopify/toxiproxy/v2, in process).
//
// # The faults
//
// A chaos driver, for --duration: freezes workers past their TTL (SIGSTOP,
// then SIGCONT), preferably while they hold a grant; has a holder stop
// itself between its last validity check and its write (SIGUSR1 arms it;
// it sends itself SIGSTOP) and resumes it past its TTL, so that the write
// goes out late with its old fence, and without a resourceVersion
// precondition, leaving the fence as the only thing that can stop it; adds
// latency to, blackholes, resets or cuts a worker's traffic to the API
// server; and kills a manager replica (SIGKILL or SIGTERM, mostly the
// leader) and starts it again, freezes one (SIGSTOP) past every timeout
// and resumes it, or cuts one off the API server (its proxy holds every
// byte) for longer than its 2 s replica Lease and restores it. Each replica
// fault is in the history as replica-down and, once the replica is ready
// again, replica-up: the check that no guarded write is refused for
// webhook unavailability while a replica is healthy reads them. Faults are random
// from --seed; the run is not deterministic (real processes and a real
// scheduler), but every action is in the history. Workers add faults of
// their own: a worker sometimes walks away from a grant without releasing
// it (its handle's requests fail from then on, as for a process that has
// gone away), so that the grant expires; once a grant has ended, a worker
// sometimes sends what a replica that lost its lease still sends to the
// object — a merge patch of data only, or a delete without a precondition —
// neither of which asserts a claim.
//
// # The history and the checker
//
// Workers append JSON lines (history.Event) to their own file: an invoke
// line before each request and an ok, fail (definitely no effect) or info
// (outcome unknown) line after it. An observer in the driver watches, as the
// admin and without faults, every LockGrant, every version of every guarded
// ConfigMap and the leader Lease. At the end the driver merges all of it into
// history.jsonl and runs the checker (check.go), which fails the run if any
// of these does not hold:
//
//   - per guarded object, the accepted fences never decrease;
//   - no acknowledged write is lost: every acknowledged write is a version
//     of the object, each version adds exactly one to the count, the final
//     count is the number of versions, and every version is a write a worker
//     invoked and did not see refused (writes of unknown outcome count when
//     the object shows them);
//   - no write of an expired or superseded grant is accepted: a version's
//     fence is its grant's, and its write was invoked before the grant's
//     lease ran out, before the grant was seen ended, and before a later
//     grant of the resource was seen Held;
//   - no request that asserts nothing is accepted: no stray merge patch or
//     delete is acknowledged or shows as a version;
//   - at most one grant per resource is Held at any controller time
//     (grantedAt and endedAt), fences increase in grant order, and no grant
//     is expired before its expiresAt;
//   - the client-side history is linearizable (porcupine) for a fenced lock
//     model per resource (acquire, end, and accepted writes, which must fall
//     while their grant holds the lock) and for a compare-and-swap register
//     per guarded object (reads, acknowledged writes and conflicts).
//
// It reports handoff latency (release or expiry to the successor's
// grantedAt, for successors that were waiting) and the time from a worker's
// local deadline to the read that reconciled OWNERSHIP_UNKNOWN.
//
// Everything the run started (control plane, managers, workers, proxies) is
// stopped on success, failure and Ctrl-C. Logs, kubeconfigs and the history
// stay in the run directory it prints.
package main
