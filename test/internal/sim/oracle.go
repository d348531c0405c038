package sim

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Report counts what one round (or many) did and every violation the oracle
// found. The *Accepted counters are the release gate: all must be zero.
type Report struct {
	Rounds int

	// Mutations offered to and accepted by the resources.
	Offered, Accepted int
	// AcceptedChecked counts accepted mutations that passed the verifier's
	// proof and fence checks (CheckGuardedRequest or CheckSegment). The gate
	// requires it to equal Accepted.
	AcceptedChecked int
	// Rejections by reason code.
	Rejected map[string]int

	// StaleAccepted: a mutation accepted with a fence older than one the
	// registry had already issued for the resource, or than one the resource
	// had already accepted. It also counts a request to a guarded object
	// that asserts no claim of its own (a merge patch, an update as read, a
	// status write without a claim, a scale, an eviction) accepted from
	// anyone but the current holder, and a delete accepted without an
	// accepted pre-delete write at the deleted version.
	StaleAccepted int
	// ForgedAccepted: an injected forged, tampered or replayed mutation
	// accepted.
	ForgedAccepted int
	// AuthFailMovedFence: a mutation refused for an authentication reason
	// that nevertheless changed a resource's recorded fence or an object.
	AuthFailMovedFence int
	// ExpiredOwnerAccepted: a mutation accepted after its grant had ended or
	// its lease had run out by the registry's clock.
	ExpiredOwnerAccepted int
	// GapAccepted: a segment applied out of sequence.
	GapAccepted int
	// RegressionAccepted: a mutation accepted with a fence the resource had
	// already accepted from another grant, or a lower one.
	RegressionAccepted int
	// DoubleEffect: a segment applied twice.
	DoubleEffect int
	// HolderLockedOut: the current holder's own stamped write refused for a
	// reason that evidence on the object causes (STALE_OWNER,
	// FENCE_REGRESSION, NO_FENCE, BINDING_MISMATCH): a record or claim the
	// enforcement point never accepted locked the real holder out.
	HolderLockedOut int
	// SuccessorRefused: the current holder's own stamped write refused
	// although the registry's facts at that instant accept it: a refusal
	// decided on a replica's cache behind the registry (a successor refused
	// because the cache still names the holder before it).
	SuccessorRefused int
	// TwoHolders: two unexpired Held grants of one resource at once.
	TwoHolders int
	// LockDelayBroken: a grant issued before the lock-delay of the
	// resource's last holder had passed, that holder's lease having ended
	// without a release.
	LockDelayBroken int
	// UnknownNotReconciled: a holder that stayed OWNERSHIP_UNKNOWN longer
	// than 15 minutes; MaxUnknown is the longest stay seen.
	UnknownNotReconciled int
	MaxUnknown           time.Duration
	// DeadWaiterGranted: a request of a client killed while it waited was
	// granted after its session had lapsed, or was still live (Pending or
	// Held) past its session's lapse plus a reconcile.
	DeadWaiterGranted int
	// LiveWaiterDropped: a request of a live client ended because its
	// session was judged lapsed.
	LiveWaiterDropped int
	// Barged: a grant of a resource with permits issued while a request
	// made before it still waited (FaultSemaphore).
	Barged int
	// OverLimit: more grants of a resource with permits holding at once
	// than the largest permits any of them asked for (FaultSemaphore).
	OverLimit int
	// PhantomGrants: a counter swap that named, as the new holder, a grant
	// that had already ended (released, withdrawn, ended by a pass, or
	// deleted) when the pass that made the swap read its facts: a replica
	// granting on a cache that was behind (FaultReplicas).
	PhantomGrants int
	// PodGateBroken: a lock-gated Pod started without the fence of a grant
	// that was Held, its grant was renewed after its node's heartbeat
	// lapsed or released while it ran, or its request or grant outlived a
	// deletion while it waited or a lost kubelet by more than their bounds
	// (FaultGatedPod).
	PodGateBroken int

	// Faults injected, by kind.
	Faults map[string]int
	// Violations describes the first few violations.
	Violations []string
}

func newReport() *Report {
	return &Report{Rejected: map[string]int{}, Faults: map[string]int{}}
}

// Add merges o into r.
func (r *Report) Add(o *Report) {
	r.Rounds += o.Rounds
	r.Offered += o.Offered
	r.Accepted += o.Accepted
	r.AcceptedChecked += o.AcceptedChecked
	r.StaleAccepted += o.StaleAccepted
	r.ForgedAccepted += o.ForgedAccepted
	r.AuthFailMovedFence += o.AuthFailMovedFence
	r.ExpiredOwnerAccepted += o.ExpiredOwnerAccepted
	r.GapAccepted += o.GapAccepted
	r.RegressionAccepted += o.RegressionAccepted
	r.DoubleEffect += o.DoubleEffect
	r.HolderLockedOut += o.HolderLockedOut
	r.SuccessorRefused += o.SuccessorRefused
	r.TwoHolders += o.TwoHolders
	r.LockDelayBroken += o.LockDelayBroken
	r.UnknownNotReconciled += o.UnknownNotReconciled
	r.MaxUnknown = max(r.MaxUnknown, o.MaxUnknown)
	r.DeadWaiterGranted += o.DeadWaiterGranted
	r.LiveWaiterDropped += o.LiveWaiterDropped
	r.Barged += o.Barged
	r.OverLimit += o.OverLimit
	r.PhantomGrants += o.PhantomGrants
	r.PodGateBroken += o.PodGateBroken
	for k, v := range o.Rejected {
		r.Rejected[k] += v
	}
	for k, v := range o.Faults {
		r.Faults[k] += v
	}
	if len(r.Violations) < 10 {
		r.Violations = append(r.Violations, o.Violations[:min(len(o.Violations), 10-len(r.Violations))]...)
	}
}

// Forbidden is the sum of every counter the gate requires to be zero.
func (r *Report) Forbidden() int {
	return r.StaleAccepted + r.ForgedAccepted + r.AuthFailMovedFence + r.ExpiredOwnerAccepted +
		r.GapAccepted + r.RegressionAccepted + r.DoubleEffect + r.HolderLockedOut + r.SuccessorRefused + r.TwoHolders + r.LockDelayBroken + r.UnknownNotReconciled +
		r.DeadWaiterGranted + r.LiveWaiterDropped + r.Barged + r.OverLimit + r.PhantomGrants + r.PodGateBroken + (r.Accepted - r.AcceptedChecked)
}

// CheckedShare is the share of accepted mutations that passed the proof and
// fence checks, in percent.
func (r *Report) CheckedShare() float64 {
	if r.Accepted == 0 {
		return 100
	}
	return 100 * float64(r.AcceptedChecked) / float64(r.Accepted)
}

// Summary is the one-line summary `make faults` prints.
func (r *Report) Summary() string {
	return fmt.Sprintf("rounds=%d mutations=%d accepted=%d checked=%.1f%% stale_accepted=%d forged_accepted=%d auth_fail_moved_fence=%d expired_owner_accepted=%d gap_accepted=%d regression_accepted=%d double_effect=%d holder_locked_out=%d successor_refused=%d two_holders=%d lock_delay_broken=%d unknown_over_15m=%d max_unknown=%s dead_waiter_granted=%d live_waiter_dropped=%d barged=%d over_limit=%d phantom_grants=%d pod_gate_broken=%d",
		r.Rounds, r.Offered, r.Accepted, r.CheckedShare(), r.StaleAccepted, r.ForgedAccepted, r.AuthFailMovedFence,
		r.ExpiredOwnerAccepted, r.GapAccepted, r.RegressionAccepted, r.DoubleEffect, r.HolderLockedOut, r.SuccessorRefused, r.TwoHolders, r.LockDelayBroken, r.UnknownNotReconciled, r.MaxUnknown, r.DeadWaiterGranted, r.LiveWaiterDropped, r.Barged, r.OverLimit, r.PhantomGrants, r.PodGateBroken)
}

// history is the oracle's record of what really happened, kept apart from
// the registry (which a restore rolls back) and from the verifier.
type history struct {
	// issued is the highest fence ever issued per resource.
	issued map[string]int64
	// endedAt is when each grant reached a final phase.
	endedAt map[types.UID]time.Duration
	// expiresAt is the latest lease end the registry ever set per grant.
	expiresAt map[types.UID]time.Duration
	// heldSince is when each grant became Held.
	heldSince map[types.UID]time.Duration
	// fenceOf is the fence each grant was issued.
	fenceOf map[types.UID]int64
}

func newHistory() *history {
	return &history{issued: map[string]int64{}, endedAt: map[types.UID]time.Duration{},
		expiresAt: map[types.UID]time.Duration{}, heldSince: map[types.UID]time.Duration{}, fenceOf: map[types.UID]int64{}}
}

// liveAt reports whether grant uid was Held and unexpired at t, by the
// registry's history.
func (h *history) liveAt(uid types.UID, t time.Duration) bool {
	since, ok := h.heldSince[uid]
	if !ok || t < since {
		return false
	}
	if end, ok := h.endedAt[uid]; ok && t >= end {
		return false
	}
	return t < h.expiresAt[uid]
}

func (r *Report) violate(format string, args ...any) {
	if len(r.Violations) < 10 {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// String renders the report for humans.
func (r *Report) String() string {
	var b strings.Builder
	b.WriteString(r.Summary())
	for _, v := range r.Violations {
		b.WriteString("\n  violation: " + v)
	}
	return b.String()
}
