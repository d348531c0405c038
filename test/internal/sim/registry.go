package sim

import (
	"crypto/ed25519"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// epochBase is the virtual clock's origin on the registry's wall clock.
var epochBase = time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)

const namespace = "billing"

// registry is the API server and etcd as the controller sees them: grants,
// one FenceCounter per resource, the issuer. It applies what
// grantplan.Decide plans, as the LockGrant controller does.
type registry struct {
	grants   map[types.UID]*lockingv1alpha1.LockGrant
	counters map[string]*lockingv1alpha1.FenceCounter
	byReq    map[string]types.UID
	rv       int64
	uids     int
	epoch    int64
	revoked  []int64
	keyID    string
	key      ed25519.PrivateKey
	// crashNext makes the next pass stop between the counter write and
	// the status writes, as a controller crash would.
	crashNext bool
	// onIssue is called for each grant that becomes Held.
	onIssue func(g *lockingv1alpha1.LockGrant)
	// onEnd is called for each grant that reaches a final phase.
	onEnd func(g *lockingv1alpha1.LockGrant)
	// onCounter is called for each counter write, with the counter's spec
	// before (nil when new) and after, and how the plan ends the holder it
	// named before (endedPhase).
	onCounter func(resource string, before, after *lockingv1alpha1.FenceCounterSpec, ended lockingv1alpha1.LockGrantPhase)
	// sessions are the clients' session Leases, by name (waiters.go).
	sessions map[string]*simSession
	// sessionsNeverLapse breaks the controller's session rule (tests only).
	sessionsNeverLapse bool
	// lockDelays gives every other request a lock-delay (FaultLockDelay).
	lockDelays bool
	// dropLockDelay stores counters without their lock-delay, as a
	// controller that forgets it would (tests only).
	dropLockDelay bool
	// skipDirectList makes replicas write a Held status for a grant not
	// Held before without listing the resource's grants directly first,
	// as the controller did before (tests only).
	skipDirectList bool
	// trustCache makes replicas grant on their cache's copy of a grant
	// without reading it directly, as the controller did before (tests
	// only).
	trustCache bool
	// phantoms are the grants the last applied pass's counter swap named
	// although they had ended before the pass read them; staleReads
	// counts the grants passes read directly and found their cached copy
	// out of date (replicas.go), unnamedReads those among them a pass
	// would have ended as Held grants no counter names, and left alone.
	phantoms     []types.UID
	staleReads   int
	unnamedReads int
	// onGrant and onCounterWrite are told of every stored change of a
	// grant and a counter, for the replicas' watches (caches.go).
	onGrant        func(uid types.UID)
	onCounterWrite func(resource string)
}

func newRegistry(seed uint64) *registry {
	s := make([]byte, ed25519.SeedSize)
	copy(s, strconv.FormatUint(seed, 16))
	return &registry{
		grants: map[types.UID]*lockingv1alpha1.LockGrant{}, counters: map[string]*lockingv1alpha1.FenceCounter{},
		byReq: map[string]types.UID{}, keyID: "sim", key: ed25519.NewKeyFromSeed(s),
	}
}

func (r *registry) wall(now time.Duration) time.Time { return epochBase.Add(now) }

// bundle is the trust bundle verifiers use.
func (r *registry) bundle() *fencing.TrustBundle {
	return &fencing.TrustBundle{
		Schema:        fencing.TrustBundleSchema,
		CurrentEpoch:  r.epoch,
		RevokedEpochs: slices.Clone(r.revoked),
		Keys: []fencing.TrustedKey{{KeyID: r.keyID, Algorithm: "Ed25519", State: fencing.KeyActive,
			PublicKey: r.key.Public().(ed25519.PublicKey)}},
	}
}

// create admits a LockGrant, as the API server with lockwarden's webhooks
// does. A request ID already known returns the existing grant (the name is
// derived from it, so the API server answers AlreadyExists).
func (r *registry) create(owner, resource string, ttl int32, requestID string, now time.Duration) *lockingv1alpha1.LockGrant {
	if uid, ok := r.byReq[requestID]; ok {
		return r.grants[uid]
	}
	r.uids++
	uid := types.UID(fmt.Sprintf("uid-%d", r.uids))
	g := &lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: string(uid), UID: uid,
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: r.wall(now).Format(time.RFC3339Nano)},
		},
		Spec: lockingv1alpha1.LockGrantSpec{Resource: resource, Owner: owner, LeaseDurationSeconds: ttl, RequestID: requestID},
	}
	if r.lockDelays && r.uids%2 == 0 {
		g.Spec.LockDelaySeconds = int32(1 + r.uids/2%2)
	}
	r.grants[uid] = g
	r.byReq[requestID] = uid
	r.stampGrant(g)
	return g
}

// renew applies a renew as admission does: refused unless fencing allows it
// by the grant's state (admission has no clock: a renew past the lease end
// is accepted, and the controller's pass answers it Expired).
func (r *registry) renew(uid types.UID, caller string, target int64, now time.Duration) error {
	g := r.grants[uid]
	if g == nil {
		return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: "no such grant"}
	}
	if err := fencing.CheckRenewRequest(*facts.Grant(g), caller); err != nil {
		return err
	}
	if target > g.Spec.Renewals {
		g.Spec.Renewals = target
		r.stampGrant(g)
	}
	return nil
}

// release applies a release as admission does (by the grant's state; a
// release past the lease end ends the grant Expired in the controller's
// pass).
func (r *registry) release(uid types.UID, caller string, _ time.Duration) error {
	g := r.grants[uid]
	if g == nil {
		return &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: "no such grant"}
	}
	if err := fencing.CheckReleaseRequest(*facts.Grant(g), caller); err != nil {
		return err
	}
	g.Spec.Release = true
	r.stampGrant(g)
	return nil
}

// reconcile runs one controller pass over a resource: Decide on the facts,
// then the counter write, the record signatures and the status writes. It
// returns the time to the next deadline.
func (r *registry) reconcile(resource string, now time.Duration) time.Duration {
	var grants []lockingv1alpha1.LockGrant
	if list := sortedByUID(r.grants, func(g *lockingv1alpha1.LockGrant) bool { return g.Spec.Resource == resource }); len(list) > 0 {
		grants = make([]lockingv1alpha1.LockGrant, 0, len(list))
		for _, g := range list {
			grants = append(grants, *g) // Decide copies what it changes
		}
	}
	var counter *lockingv1alpha1.FenceCounter
	if c := r.counters[resource]; c != nil {
		counter = c.DeepCopy()
	}
	params := issuer.Params{Epoch: r.epoch, Revoked: slices.Clone(r.revoked), KeyID: r.keyID, Key: r.key}
	p := grantplan.Decide(grantplan.Facts{
		Now: r.wall(now), Resource: resource, Counter: counter, Grants: grants,
		Epoch: r.epoch, Revoked: params.Revoked, Sessions: r.sessionFacts(now),
	})
	revision := ""
	if c := r.counters[resource]; c != nil {
		revision = c.ResourceVersion
	}
	// The counter first, then the statuses in the plan's order, as the
	// controller writes them.
	if p.Counter != nil {
		revision = r.writeCounter(resource, p)
	}
	if r.crashNext {
		r.crashNext = false
		return time.Millisecond // the restarted controller comes back at once
	}
	for _, sg := range grantplan.Sign(p, params, revision) {
		sg.Grant.Status.Record, sg.Grant.Status.Proof = sg.Record, sg.Proof
	}
	for _, g := range p.Statuses {
		cur := r.grants[g.UID]
		if cur == nil {
			continue
		}
		r.setStatus(cur, g)
	}
	return p.RequeueAfter
}

// writeCounter stores the plan's counter (the compare-and-swap succeeded)
// and tells the oracle; it returns the new resourceVersion.
func (r *registry) writeCounter(resource string, p grantplan.Plan) string {
	r.rv++
	c := r.counters[resource]
	var before *lockingv1alpha1.FenceCounterSpec
	if c == nil {
		c = &lockingv1alpha1.FenceCounter{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: lockingv1alpha1.FenceCounterName(resource)}}
		r.counters[resource] = c
	} else {
		before = c.Spec.DeepCopy()
	}
	if p.Counter.Fence < c.Spec.Fence {
		panic(fmt.Sprintf("the plan lowers the fence of %s from %d to %d", resource, c.Spec.Fence, p.Counter.Fence))
	}
	c.Spec = *p.Counter.DeepCopy()
	r.forgetLockDelay(c)
	c.ResourceVersion = strconv.FormatInt(r.rv, 10)
	c.Generation++
	if r.onCounterWrite != nil {
		r.onCounterWrite(resource)
	}
	if r.onCounter != nil {
		r.onCounter(resource, before, &c.Spec, endedPhase(p, before, r.grants))
	}
	return c.ResourceVersion
}

// endedPhase is how the holder a counter named before a write ends: its
// final phase in the plan, else as stored; "" when its grant is gone (or
// it goes on holding).
func endedPhase(p grantplan.Plan, before *lockingv1alpha1.FenceCounterSpec, grants map[types.UID]*lockingv1alpha1.LockGrant) lockingv1alpha1.LockGrantPhase {
	if before == nil || before.Holder == nil {
		return ""
	}
	uid := types.UID(before.Holder.UID)
	for _, g := range p.Statuses {
		if g.UID == uid && g.Status.Phase.Final() {
			return g.Status.Phase
		}
	}
	if g := grants[uid]; g != nil && g.Status.Phase.Final() {
		return g.Status.Phase
	}
	return ""
}

// setStatus writes g's status onto the stored grant cur and tells the
// oracle about a grant that became Held or ended.
func (r *registry) setStatus(cur, g *lockingv1alpha1.LockGrant) {
	wasHeld, wasFinal := cur.Status.Phase == lockingv1alpha1.PhaseHeld, cur.Status.Phase.Final()
	cur.Status = *g.Status.DeepCopy()
	r.stampGrant(cur)
	if !wasHeld && cur.Status.Phase == lockingv1alpha1.PhaseHeld && r.onIssue != nil {
		r.onIssue(cur)
	}
	if !wasFinal && cur.Status.Phase.Final() && r.onEnd != nil {
		r.onEnd(cur)
	}
}

// snapshot is a copy of the registry's state, as an etcd snapshot.
type snapshot struct {
	grants   map[types.UID]*lockingv1alpha1.LockGrant
	counters map[string]*lockingv1alpha1.FenceCounter
	byReq    map[string]types.UID
	epoch    int64
	revoked  []int64
}

func (r *registry) snapshot() *snapshot {
	s := &snapshot{grants: map[types.UID]*lockingv1alpha1.LockGrant{}, counters: map[string]*lockingv1alpha1.FenceCounter{},
		byReq: maps.Clone(r.byReq), epoch: r.epoch, revoked: slices.Clone(r.revoked)}
	for k, g := range r.grants {
		s.grants[k] = g.DeepCopy()
	}
	for k, c := range r.counters {
		s.counters[k] = c.DeepCopy()
	}
	return s
}

// restore rolls the registry back to s. Grant UIDs are never reused (etcd
// revisions are bumped past the snapshot's, and UIDs are random in real
// clusters), so new grants after the restore are new acquisitions.
func (r *registry) restore(s *snapshot) {
	r.grants, r.counters, r.byReq = map[types.UID]*lockingv1alpha1.LockGrant{}, map[string]*lockingv1alpha1.FenceCounter{}, maps.Clone(s.byReq)
	for k, g := range s.grants {
		r.grants[k] = g.DeepCopy()
	}
	for k, c := range s.counters {
		r.counters[k] = c.DeepCopy()
	}
	r.epoch, r.revoked = s.epoch, slices.Clone(s.revoked)
	r.rv += 1000
}

// facts reads what a write naming grant uid is judged on, as an
// enforcement point does (facts.ReadRegistry), linearizably: the counter,
// and the grant unless the counter names it with its lease. A grant's name
// is its UID here.
func (r *registry) facts(uid types.UID, resource string) (*fencing.Grant, *fencing.Counter) {
	return facts.Registry(string(uid), r.grants[uid], r.counters[resource])
}

// sortedByUID lists the grants in grants that keep says to keep, in order
// of their UIDs (sorting pointers, not the grants themselves).
func sortedByUID(grants map[types.UID]*lockingv1alpha1.LockGrant, keep func(*lockingv1alpha1.LockGrant) bool) []*lockingv1alpha1.LockGrant {
	out := make([]*lockingv1alpha1.LockGrant, 0, len(grants))
	for _, g := range grants {
		if keep(g) {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b *lockingv1alpha1.LockGrant) int { return compareUID(a.UID, b.UID) })
	return out
}

func compareUID(a, b types.UID) int {
	switch {
	case len(a) != len(b):
		return len(a) - len(b)
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
