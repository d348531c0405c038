// Package clockskew measures how far this replica's clock is from the API
// server's, so that a replica whose clock breaks the bound lockwarden's
// lease judgments assume (docs/ha.md: 250 ms between replicas, and a
// holder's safety margin above it) is noticed instead of silently ending
// leases early or late.
//
// The API server's clock is read from the Date header of its answers,
// which has whole seconds only. One answer says that, at some instant
// between the request's send and its answer by the local clock, the
// server's clock read that second: an interval of about a second plus the
// round trip for the offset (Bound). Requests timed so that the server's
// second ticks over while they are in flight split that interval; the
// intersection of a few such samples narrows the offset to about the round
// trip (Estimator), the method of htpdate's precision mode. Samples older
// than a window are dropped, so a clock that drifts or is stepped is
// followed.
//
// Monitor samples the API server, exports the estimate as the metric
// lockwarden_clock_skew_seconds, logs when the skew is surely beyond the
// bound, and fails a readiness check when it is surely beyond the
// readiness bound. What is guaranteed: an offset the monitor reports as
// beyond a bound is beyond it for certain (the measurement's uncertainty is
// subtracted); one within it may still be off by the uncertainty, which the
// metric lockwarden_clock_skew_uncertainty_seconds reports. The API
// server's clock is the reference: if it is itself off, every replica
// reports the same offset.
package clockskew
