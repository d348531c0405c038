package sim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Fault is one kind of fault the simulation injects.
type Fault string

// The fault matrix: the kinds of fault a round can inject (docs/faults.md).
const (
	// FaultPause freezes a holder between its validity check and its
	// write, past its TTL (GC pause, SIGSTOP, VM migration).
	FaultPause Fault = "pause"
	// FaultLostRenew loses renew responses; the holder must read the grant.
	FaultLostRenew Fault = "lost-renew"
	// FaultReleaseReacquire loses a release reply; the owner re-acquires
	// and then retries the release of its earlier grant, which must not free
	// the new one.
	FaultReleaseReacquire Fault = "release-reacquire"
	// FaultSegmentDisorder sends segments out of order, twice, and again
	// with another payload.
	FaultSegmentDisorder Fault = "segment-disorder"
	// FaultLateMessage delivers a write long after it was sent.
	FaultLateMessage Fault = "late-message"
	// FaultRestore restores the registry from an old snapshot; the
	// operator recovers by bumping the issuer epoch.
	FaultRestore Fault = "restore"
	// FaultLostAck loses a segment's commit acknowledgement; the holder
	// resolves MUTATION_UNKNOWN by looking up the receipt.
	FaultLostAck Fault = "lost-ack"
	// FaultForgedFence presents a huge fence with a real proof.
	FaultForgedFence Fault = "forged-fence"
	// FaultTamperedRecord changes a field of a signed record.
	FaultTamperedRecord Fault = "tampered-record"
	// FaultReplay presents a proof for another resource's object.
	FaultReplay Fault = "replay"
	// FaultRevokedEpoch revokes the issuer epoch of the current grants.
	FaultRevokedEpoch Fault = "revoked-epoch"
	// FaultControllerCrash stops a controller pass between the counter
	// write and the status writes.
	FaultControllerCrash Fault = "controller-crash"
	// FaultSharedIdentity runs the workers as replicas of one Deployment:
	// one caller identity for all. A replica whose grant was superseded
	// still sends a merge patch, a re-read update without restamping, a
	// bare delete or its own old claim.
	FaultSharedIdentity Fault = "shared-identity"
	// FaultUnasserted sends writes that assert nothing of their own — a
	// merge patch of data only, a re-read and update without restamping —
	// from the current holder, a superseded one and an identity with no
	// grant.
	FaultUnasserted Fault = "unasserted-write"
	// FaultLookalike creates the object unguarded while it does not exist,
	// with a forged record (a huge fence) and a forged claim (bogus, or
	// exactly the claim the holder is about to make); then the real holder
	// puts it under guard, and a stale writer tries again.
	FaultLookalike Fault = "unguarded-lookalike"
	// FaultSubresource writes the status with and without a claim, removes
	// the guard label through the status, scales and evicts.
	FaultSubresource Fault = "subresource-write"
	// FaultDelete deletes the guarded object: the holder's pre-delete write
	// and its delete under that version, and deletes without a
	// precondition, without a pre-delete write or under a stale one.
	FaultDelete Fault = "guarded-delete"
	// FaultLockDelay gives every other request a lock-delay of 1 or 2 s:
	// after such a holder's lease ends without a release, nobody may be
	// granted the resource before the delay has passed.
	FaultLockDelay Fault = "lock-delay"
)

// FaultReplicas runs two controller replicas, each deciding at its own
// skewed clock, on the same resources at once (replicas.go). Not in Faults:
// every other mixed-schedule round plays it besides its kinds.
const FaultReplicas Fault = "replicas"

// Faults lists every fault kind.
var Faults = []Fault{
	FaultPause, FaultLostRenew, FaultReleaseReacquire, FaultSegmentDisorder, FaultLateMessage, FaultRestore,
	FaultLostAck, FaultForgedFence, FaultTamperedRecord, FaultReplay, FaultRevokedEpoch, FaultControllerCrash,
	FaultKilledWaiter,
	FaultSharedIdentity, FaultUnasserted, FaultLookalike, FaultSubresource, FaultDelete,
	FaultLockDelay, FaultGatedPod,
}

// world is one round: the scheduler, the registry, the resources, the
// workers and the oracle.
type world struct {
	seed  uint64
	s     scheduler
	rng   *rand.Rand
	reg   *registry
	h     *history
	rep   *Report
	fault map[Fault]bool
	// ends is how each resource's last holder ended (lockdelay.go).
	ends map[string]lastEnd

	// resource is the contended resource; other is a second one, the
	// target of replayed proofs. objects are keyed by name: the guarded
	// object of each resource is named after it; lookalike is a second
	// object naming resource, which does not exist at first.
	resource, other, lookalike string
	objects                    map[string]*object
	stores                     map[string]*store
	workers                    []*worker

	// pending marks a reconcile already scheduled per resource.
	pending map[string]bool
	// replicas are the manager replicas, each deciding at its own clock
	// (replicas.go).
	replicas []*replica
	// resurrected are grants a restore brought back to life; restoredAt is
	// when the registry was restored (0: never); recovered says the
	// operator has since bumped the epoch past every epoch ever used.
	resurrected map[types.UID]bool
	restoredAt  time.Duration
	recovered   bool
	// maxEpoch is the highest issuer epoch ever used, which a restore does
	// not roll back (the operator knows it).
	maxEpoch int64
	horizon  time.Duration
	// broken breaks the guarded-object enforcement point (tests only).
	broken int
	// objIssued is the highest fence issued per resource as the guarded
	// objects' etcd knows it: a restore rolls it back together with the
	// objects, while the oracle's history keeps the truth for the store.
	objIssued map[string]int64
	// waiters are the session clients of FaultKilledWaiter, by grant UID.
	waiters map[types.UID]*waiterProc
	// gated are the lock-gated Pods of FaultGatedPod (gatedpods.go).
	gated *gatedPods
	// admission picks the replica that answers each guarded write, as the
	// webhook Service spreads them, from a stream of its own, so that
	// the rest of a round's schedule does not depend on it (admission.go).
	admission *rand.Rand
}

func newWorld(seed uint64, faults []Fault) *world {
	w := &world{
		seed: seed, rng: rand.New(rand.NewPCG(seed, 0x10c4a2de)), reg: newRegistry(seed), h: newHistory(), rep: newReport(),
		fault: map[Fault]bool{}, resource: "invoice-batch/2026-07-19", other: "invoice-batch/2026-07-20", lookalike: "settle-copy",
		objects: map[string]*object{}, stores: map[string]*store{}, pending: map[string]bool{},
		resurrected: map[types.UID]bool{}, objIssued: map[string]int64{},
		admission: rand.New(rand.NewPCG(seed, 0xad3155)),
	}
	for _, f := range faults {
		w.fault[f] = true
	}
	for _, r := range []string{w.resource, w.other} {
		w.reg.rv++
		w.objects[r] = &object{resource: r, exists: true, guarded: true, rv: w.reg.rv}
	}
	w.objects[w.lookalike] = &object{resource: w.resource}
	w.stores[w.resource] = newStore(w.resource)
	w.reg.onIssue = func(g *lockingv1alpha1.LockGrant) {
		if w.resurrected[g.UID] {
			// A restore brought back a request that had since ended; it
			// is granted now in a life of its own.
			delete(w.h.endedAt, g.UID)
		}
		w.h.heldSince[g.UID] = w.s.now
		w.h.fenceOf[g.UID] = g.Status.FenceToken
		w.h.issued[g.Spec.Resource] = max(w.h.issued[g.Spec.Resource], g.Status.FenceToken)
		w.objIssued[g.Spec.Resource] = max(w.objIssued[g.Spec.Resource], g.Status.FenceToken)
	}
	w.reg.onEnd = func(g *lockingv1alpha1.LockGrant) {
		if _, ok := w.h.endedAt[g.UID]; !ok {
			w.h.endedAt[g.UID] = w.s.now
		}
	}
	w.reg.onCounter = func(resource string, before, after *lockingv1alpha1.FenceCounterSpec, ended lockingv1alpha1.LockGrantPhase) {
		w.noteHolderEnd(resource, before, after, ended)
		// The counter is the holder of record: a holder it stops naming
		// has ended, whenever its status says so, and one it names anew
		// is granted now.
		if before != nil && before.Holder != nil && (after.Holder == nil || after.Holder.UID != before.Holder.UID) {
			if _, ok := w.h.endedAt[types.UID(before.Holder.UID)]; !ok {
				w.h.endedAt[types.UID(before.Holder.UID)] = w.s.now
			}
		}
		if h := after.Holder; h != nil && (before == nil || before.Holder == nil || before.Holder.UID != h.UID) {
			if g := w.reg.grants[types.UID(h.UID)]; g != nil {
				w.checkLockDelay(g)
			}
		}
		// The counter carries the live lease, and admission judges it
		// there: the history's lease end is the latest either says.
		if h := after.Holder; h != nil {
			if end, ok, err := h.LeaseEnd(); ok && err == nil {
				w.h.expiresAt[types.UID(h.UID)] = max(w.h.expiresAt[types.UID(h.UID)], end.Sub(epochBase))
			}
		}
	}
	return w
}

// between returns a uniformly random duration in [lo, hi].
func (w *world) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

// netDelay is one network hop.
func (w *world) netDelay() time.Duration { return w.between(time.Millisecond, 40*time.Millisecond) }

// kick schedules a controller pass over resource, as a watch event does.
func (w *world) kick(resource string) {
	if w.fault[FaultReplicas] {
		w.kickReplicas(resource)
		return
	}
	if w.pending[resource] {
		return
	}
	w.pending[resource] = true
	w.s.after(w.between(time.Millisecond, 15*time.Millisecond), func() { w.reconcile(resource) })
}

// reconcile runs the controller's pass, updates the oracle's history,
// checks that at most one grant holds, and notifies the owners.
func (w *world) reconcile(resource string) {
	w.pending[resource] = false
	if w.fault[FaultControllerCrash] && w.chance(0.05) {
		w.reg.crashNext = true
		w.rep.Faults[string(FaultControllerCrash)]++
	}
	w.afterPass(resource, w.reg.reconcile(resource, w.s.now))
}

// afterPass updates the oracle's history after a controller pass, checks
// that at most one grant holds, and notifies the owners.
func (w *world) afterPass(resource string, requeue time.Duration) {
	w.afterStatus(resource)
	if requeue > 0 {
		w.s.after(requeue, func() { w.kick(resource) })
	}
}

// afterStatus updates the oracle's history after statuses were written,
// checks that at most one grant holds, and notifies the owners.
func (w *world) afterStatus(resource string) {
	held := 0
	for _, g := range w.reg.grants {
		if g.Spec.Resource != resource || g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Status.ExpiresAt == nil {
			continue
		}
		exp := g.Status.ExpiresAt.Sub(epochBase)
		w.h.expiresAt[g.UID] = max(w.h.expiresAt[g.UID], exp)
		if exp > w.s.now {
			held++
		}
	}
	if held > 1 {
		w.rep.TwoHolders++
		w.rep.violate("seed %d: %d unexpired Held grants of %s at %s", w.seed, held, resource, w.s.now)
	}
	for _, wk := range w.workers {
		wk.notify()
	}
}

// inRestoreWindow reports whether the registry has been restored from an
// old snapshot and the operator has not recovered yet. In that window the
// registry has forgotten fences it issued; a resource can refuse only what
// it has itself seen (FENCE_REGRESSION, STALE_OWNER), which the oracle
// still requires. See docs/segments.md for the runbook that closes the
// window.
func (w *world) inRestoreWindow() bool { return w.restoredAt > 0 && !w.recovered }

// run plays the round to its horizon and returns its report.
func (w *world) run() *Report {
	w.reg.lockDelays = w.fault[FaultLockDelay]
	w.horizon = 3 * time.Minute
	n := 2 + w.rng.IntN(3)
	for i := range n {
		name := fmt.Sprintf("system:serviceaccount:billing:worker-%d", i)
		if w.fault[FaultSharedIdentity] {
			name = "system:serviceaccount:billing:settle" // replicas of one Deployment
		}
		wk := newWorker(w, name, i)
		w.workers = append(w.workers, wk)
		w.s.after(w.between(0, 2*time.Second), wk.step)
	}
	w.scheduleAdversary()
	w.scheduleWaiters()
	w.scheduleDoors()
	w.scheduleGatedPods()
	w.s.run(w.horizon)
	for _, wk := range w.workers {
		wk.finish()
	}
	w.checkWaiters()
	w.checkGatedPods()
	w.rep.Rounds = 1
	return w.rep
}
