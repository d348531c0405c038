// Package chaos runs a short real-process chaos run (cmd/lockwarden-chaos)
// as part of `make test`: two manager replicas with leader election, worker
// processes behind fault proxies, freezes past the TTL, replica kills and
// network faults for about a minute, then the history checker. `make chaos
// DURATION=...` runs the same suite for longer.
package chaos
