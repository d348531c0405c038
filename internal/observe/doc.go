// Package observe measures what lockwarden's users wait for, as Prometheus
// histograms on controller-runtime's registry:
//
//   - lockwarden_grant_wait_seconds: from a LockGrant's creation to the
//     moment it was granted (status.grantedAt), for every grant.
//   - lockwarden_grant_handoff_seconds: for a grant that queued behind
//     another, from the previous holder's end (status.endedAt) to this
//     grant's status.grantedAt: how long a resource stood unheld while
//     someone waited.
//   - lockwarden_admission_duration_seconds{webhook}: how long the manager
//     took to answer an admission request, by registered webhook path (all
//     GuardPolicies share one path per mode). Server-side dry runs are
//     timed too: the API server waits for their answer as for any write,
//     and the histogram counts answers, not decisions (the guard's
//     decision and Shadow counters leave dry runs out).
//
// No histogram has a per-resource or per-object label: their cardinality
// is fixed. Times are the API server's and the controller's timestamps, not
// the holder's. The grant observer runs on the elected leader only, so a
// grant is counted once across replicas; it counts grants that became held
// while it ran, not those granted while no leader was up.
package observe
