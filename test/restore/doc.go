// Package restore tests what happens when the lock registry goes back in
// time: the control plane's etcd is restored from an old snapshot, so
// FenceCounters reissue fences that protected resources have already
// accepted. It runs the product as a user would: etcd and
// kube-apiserver from bin/ (envtest), config/local applied with kubectl, the
// real manager binary as a process, the examples/settlement worker as a
// process, and a real PostgreSQL (internal/test/pgtest).
//
// The tests show:
//   - FENCE_REGRESSION end to end: after the restore, grants that reissue an
//     already accepted fence are refused by the PostgreSQL store, which
//     records an alarm, counts it and calls its hook; the holder reports it
//     on its LockGrant, and the controller raises the FenceRegression
//     condition, a Warning Event and
//     lockwarden_grant_transitions_total{reason="FENCE_REGRESSION"}. The
//     store's highest fence is never lowered.
//   - Recovery by bumping the issuer epoch (the runbook in docs/segments.md):
//     new fences are larger than everything issued before the restore, the
//     store accepts them, and a grant held before the restore is Revoked and
//     can never renew or write again.
//   - Against Kubernetes guarded objects (against PostgreSQL they are in
//     pkg/store/postgres): a restore that makes the registry reissue an
//     accepted fence; a holder that releases while its operation is still
//     writing, and its successor's writes; a new owner that retries an
//     operation while the earlier attempt still runs.
//
// The whole package shares one control plane and one manager (TestMain).
// The manager's webhooks listen on a free port, not on config/local's 9443,
// so that this package can run beside test/e2e and `make demo`.
package restore
