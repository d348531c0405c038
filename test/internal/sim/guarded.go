package sim

import (
	"strconv"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// object is a Kubernetes object that a guard label can put under the
// guarded-object protocol (docs/guarded-writes.md), as the API server stores
// it. It lives in the registry's etcd: a restore rolls it back too.
type object struct {
	// resource is the resource ID the object names; it is guarded by it
	// only while guarded is set (the guard label).
	resource string
	exists   bool
	guarded  bool
	// rv is the object's resourceVersion.
	rv int64
	// claim is what the claim annotations hold; record what the Accepted*
	// annotations hold. On an object that was never guarded, anyone may
	// have written either.
	claim  fencing.Claim
	record fencing.Accepted
	// data, status and replicas are the object's content, its status and
	// its scale.
	data, status string
	replicas     int

	// truth is the oracle's own view of the object, kept by name across
	// deletes; the enforcement point never reads it.
	truth objectTruth
}

// objectTruth is what the enforcement point really accepted on an object.
type objectTruth struct {
	// fence and by are the highest fence the enforcement point accepted on
	// the object and the grant of the write that carried it.
	fence int64
	by    types.UID
	// predeleteRV is the version the last accepted write made when it
	// claimed intent "delete" (0: the last accepted write did not), and
	// predeleteBy its grant.
	predeleteRV int64
	predeleteBy types.UID
}

// body is how a request builds the object it asks the API server to store.
type body int

const (
	// bodyStamped sets the sender's own claim (pkg/lock's Stamp) with the
	// guard label: an apply, update or patch that asserts.
	bodyStamped body = iota
	// bodyMerge is a merge patch of data (or status) only: everything
	// else, the claim annotations included, is the stored object's.
	bodyMerge
	// bodyAsRead is a re-read and update without restamping: the object as
	// read earlier, with new data, under the read version's precondition.
	bodyAsRead
	// bodyForged is an unguarded look-alike: no guard label, a forged
	// record and claim.
	bodyForged
	// bodyUnguard is a status patch that removes the guard label.
	bodyUnguard
	// bodyScale is a Scale: it changes replicas and cannot carry a claim.
	bodyScale
	// bodyNone is a delete or an eviction.
	bodyNone
)

// writeMsg is one request to an object, in flight.
type writeMsg struct {
	// op is the operation; upsert makes it a create when the object does
	// not exist (server-side apply).
	op     fencing.Operation
	upsert bool
	// sub is the subresource ("" for the object); opaque is set for a
	// request whose body is not the object (scale, eviction).
	sub    string
	opaque bool
	body   body
	caller string
	target string // the object's name
	data   string
	// uid and fence are the grant of the process that sent the request and
	// its fence ("" and 0 for one that holds none); proof is its proof and
	// intent the intent it claims. A stamped request claims exactly these;
	// for an injected one they are what it claims.
	uid    types.UID
	fence  int64
	proof  fencing.Proof
	intent string
	// precondition is the resourceVersion the request requires (0: none).
	precondition int64
	// read is the object as read earlier (bodyAsRead).
	read *object
	// writeID is the fresh random ID a stamped request's claim carries
	// (pkg/lock sets one on every write).
	writeID string
	// forgedClaim and forgedRecord are what a look-alike carries.
	forgedClaim  fencing.Claim
	forgedRecord fencing.Accepted
	// injected marks a forged, tampered or replayed claim.
	injected string
	// onAnswer, if set, gets the outcome and the version it made.
	onAnswer func(accepted bool, reason fencing.Reason, rv int64)
}

// asserts reports whether the request sets a claim of its own.
func (m writeMsg) asserts() bool { return m.body == bodyStamped }

// claim is what a stamped request sets in the claim annotations.
func (m writeMsg) claim() fencing.Claim {
	return fencing.Claim{Grant: string(m.uid), Fence: strconv.FormatInt(m.fence, 10), Proof: string(m.proof), Intent: m.intent, WriteID: m.writeID}
}

// writeIDs numbers write IDs: unique, like the random ones of pkg/lock,
// without drawing from a world's random source.
var writeIDs atomic.Uint64

func newWriteID() string { return "w" + strconv.FormatUint(writeIDs.Add(1), 36) }

// apply builds the object the request asks to store from the stored one.
func (m *writeMsg) apply(stored object) object {
	o := stored
	o.exists = true
	switch m.body {
	case bodyStamped:
		o.guarded, o.claim = true, m.claim()
		o.setContent(m.sub, m.data)
	case bodyMerge:
		o.setContent(m.sub, m.data)
	case bodyAsRead:
		o = *m.read
		o.rv, o.truth = stored.rv, stored.truth
		o.setContent(m.sub, m.data)
	case bodyForged:
		o.guarded, o.claim, o.record, o.data = false, m.forgedClaim, m.forgedRecord, m.data
	case bodyUnguard:
		o.guarded = false
	case bodyScale:
		o.replicas++
	}
	return o
}

func (o *object) setContent(sub, data string) {
	if sub == "status" {
		o.status = data
		return
	}
	o.data = data
}

// Broken enforcement points, for the tests that show the oracle catches
// them.
const (
	brokenNone = iota
	// brokenAcceptAll accepts every request to a guarded object.
	brokenAcceptAll
	// brokenTrustInherited keeps the claim on the object and takes a claim
	// the stored object carried as asserted (a guard that reads the stored state as the write's claim).
	brokenTrustInherited
	// brokenTrustRecord takes the record of an object that was not guarded
	// as the enforcement point's own.
	brokenTrustRecord
	// brokenRefuseFromCache refuses on a replica's cached counter, without
	// the direct read before a refusal.
	brokenRefuseFromCache
)

// The API server's own refusals, before admission.
const (
	reasonAlreadyExists fencing.Reason = "ALREADY_EXISTS"
	reasonNotFound      fencing.Reason = "NOT_FOUND"
	reasonConflict      fencing.Reason = "CONFLICT"
)

// authReasons are refusals of a write that did not authenticate.
var authReasons = map[fencing.Reason]bool{
	fencing.ReasonBadSignature: true, fencing.ReasonBindingMismatch: true, fencing.ReasonNotOwner: true,
	fencing.ReasonRevokedEpoch: true, fencing.ReasonUnknownGrant: true, fencing.ReasonNoFence: true,
	fencing.ReasonInvalidSegment: true, fencing.ReasonFenceNotIssued: true,
}

// lockoutReasons are the refusals that evidence on the object (a record or
// a claim) causes; the current holder's own write must never get one.
var lockoutReasons = map[fencing.Reason]bool{
	fencing.ReasonStaleOwner: true, fencing.ReasonFenceRegression: true, fencing.ReasonNoFence: true,
	fencing.ReasonBindingMismatch: true,
}

// deliver is the API server with lockwarden's guard: the API server's own
// checks (existence, the update's resourceVersion precondition), then, for a
// request to an object guarded before or after it, the enforcement point as
// the webhook runs it — gather the claim after the request is applied, the
// stored claim, the record only when the stored object was guarded, the
// registry's facts — and fencing.CheckGuardedRequest. On acceptance the claim
// is consumed and the record written in the same write.
func (w *world) deliver(m writeMsg) {
	now := w.s.now
	obj := w.objects[m.target]
	stored := *obj
	answer := func(accepted bool, reason fencing.Reason) {
		if m.onAnswer != nil {
			rv := obj.rv
			w.s.after(w.netDelay(), func() { m.onAnswer(accepted, reason, rv) })
		}
	}
	op := m.op
	if m.upsert && !stored.exists {
		op = fencing.OpCreate
	}
	switch {
	case op == fencing.OpCreate && stored.exists:
		w.rep.Rejected[string(reasonAlreadyExists)]++
		answer(false, reasonAlreadyExists)
		return
	case op != fencing.OpCreate && !stored.exists:
		w.rep.Rejected[string(reasonNotFound)]++
		answer(false, reasonNotFound)
		return
	case op == fencing.OpUpdate && m.precondition != 0 && m.precondition != stored.rv:
		w.rep.Rejected[string(reasonConflict)]++
		answer(false, reasonConflict)
		return
	}
	var after *object
	if op != fencing.OpDelete {
		a := m.apply(stored)
		after = &a
	}
	if (!stored.exists || !stored.guarded) && (after == nil || !after.guarded) {
		// Not guarded before or after: admission lets it through.
		w.rep.Faults["unguarded-write"]++
		w.commit(obj, after)
		answer(true, "")
		return
	}
	w.rep.Offered++
	r := fencing.GuardedRequest{
		Operation: op, Subresource: m.sub, Opaque: m.opaque, Resource: stored.resource, ObjectNamespace: namespace,
		Caller: m.caller, StoredGuarded: stored.exists && stored.guarded, StoredVersion: strconv.FormatInt(stored.rv, 10),
		Bundle: w.reg.bundle(), Now: w.reg.wall(now),
	}
	if m.precondition != 0 {
		r.Precondition = strconv.FormatInt(m.precondition, 10)
	}
	if after != nil {
		r.Claim = after.claim
	}
	if stored.exists {
		r.StoredClaim = stored.claim
	}
	if r.StoredGuarded {
		r.Record = stored.record
	}
	switch w.broken {
	case brokenTrustInherited:
		r.StoredClaim = fencing.Claim{}
	case brokenTrustRecord:
		r.StoredGuarded, r.Record = stored.exists, stored.record
	}
	rec, cachedBy, err := w.admit(r, stored.resource)
	if w.broken == brokenAcceptAll {
		err = nil
		if a, perr := fencing.ParseClaim(r.Claim, namespace); perr == nil {
			rec = fencing.Accepted{Grant: a.GrantNamespace + "/" + a.GrantName, Fence: a.Fence, Intent: a.Intent}
		}
	}
	if err != nil {
		reason := fencing.ReasonOf(err)
		w.rep.Rejected[string(reason)]++
		if authReasons[reason] && *obj != stored {
			w.rep.AuthFailMovedFence++
			w.rep.violate("seed %d: refused %s changed object %s", w.seed, reason, m.target)
		}
		w.checkLockout(m, op, stored, reason, now)
		w.checkRefusedOnRegistry(m, op, r, stored, reason, now)
		answer(false, reason)
		return
	}
	w.rep.Accepted++
	if w.broken == brokenNone {
		w.rep.AcceptedChecked++
	}
	truth := w.judgeGuarded(m, op, stored, cachedBy, now)
	if after != nil {
		if w.broken != brokenTrustInherited {
			after.claim = fencing.Claim{}
		}
		after.record = rec
	}
	w.commit(obj, after)
	obj.truth = truth
	if rec.Intent == fencing.IntentDelete {
		obj.truth.predeleteRV, obj.truth.predeleteBy = obj.rv, truth.by
	}
	answer(true, "")
}

// commit stores after (nil: deletes the object) with a new resourceVersion
// from the registry's etcd.
func (w *world) commit(obj *object, after *object) {
	w.reg.rv++
	if after == nil {
		*obj = object{resource: obj.resource, rv: w.reg.rv, truth: obj.truth}
		return
	}
	*obj = *after
	obj.rv = w.reg.rv
}

// judgeGuarded checks one accepted request to a guarded object against the
// history and returns the object's truth after it. A stamped write is judged
// by the grant and fence it claims; a request that asserts nothing of its
// own (a merge patch, an update as read, a subresource, a scale) must come
// from the current holder, by the history; a delete must delete exactly the
// version an accepted pre-delete write made, under a grant that is still
// the current holder's.
//
// An acceptance answered from a replica's cache (cachedBy) that is in the
// window cached admission adds (inAdmissionLag) is counted, not forbidden.
func (w *world) judgeGuarded(m writeMsg, op fencing.Operation, stored object, cachedBy *replica, now time.Duration) objectTruth {
	t := stored.truth
	t.predeleteRV, t.predeleteBy = 0, ""
	issued := w.objIssued[stored.resource]
	switch {
	case op == fencing.OpDelete:
		by := stored.truth.predeleteBy
		if stored.truth.predeleteRV != stored.rv || by == "" {
			w.rep.StaleAccepted++
			w.rep.violate("seed %d: delete of %s by %s accepted at %s without a pre-delete write at its version", w.seed, m.target, m.caller, now)
			return t
		}
		if m.uid != by {
			// A replica of the same identity sent the delete the holder's
			// pre-delete write prepared: the same delete, at the same version.
			w.rep.Faults["delete-sent-by-replica"]++
		}
		lagged := w.inAdmissionLag(cachedBy, stored.resource, by, w.h.fenceOf[by], stored.truth.fence, now)
		w.judge("delete", stored.resource, by, w.h.fenceOf[by], m.injected, issued, stored.truth.fence, stored.truth.by, lagged, now)
	case !m.asserts() && m.injected == "":
		switch {
		case w.current(m.uid, issued, now):
		case w.inAdmissionLag(cachedBy, stored.resource, m.uid, m.fence, t.fence, now):
			w.rep.Faults[admissionLagFault]++
		default:
			w.rep.StaleAccepted++
			w.rep.violate("seed %d: %s of %s by %q (grant %q), asserting nothing, accepted at %s; it is not the current holder",
				w.seed, describeMsg(m), m.target, m.caller, m.uid, now)
		}
		if m.fence >= t.fence {
			t.fence, t.by = m.fence, m.uid
		}
	default:
		lagged := w.inAdmissionLag(cachedBy, stored.resource, m.uid, m.fence, stored.truth.fence, now)
		w.judge("write", stored.resource, m.uid, m.fence, m.injected, issued, stored.truth.fence, stored.truth.by, lagged, now)
		if m.fence >= t.fence {
			t.fence, t.by = m.fence, m.uid
		}
	}
	return t
}

// current reports whether grant uid is, by the history, live at now with
// the highest fence issued for its resource.
func (w *world) current(uid types.UID, issued int64, now time.Duration) bool {
	return uid != "" && w.h.liveAt(uid, now) && w.h.fenceOf[uid] >= issued
}

// checkLockout counts a refusal of the current holder's own stamped write
// for a reason that evidence on the object causes: a forged record or claim
// has locked the real holder out.
func (w *world) checkLockout(m writeMsg, op fencing.Operation, stored object, reason fencing.Reason, now time.Duration) {
	if !m.asserts() || m.injected != "" || op == fencing.OpDelete || !lockoutReasons[reason] ||
		m.fence != w.h.fenceOf[m.uid] || !w.current(m.uid, w.objIssued[stored.resource], now) ||
		w.restoredAt > 0 || w.resurrected[m.uid] {
		return
	}
	w.rep.HolderLockedOut++
	w.rep.violate("seed %d: the current holder %s (fence %d) was refused %s on %s at %s", w.seed, m.uid, m.fence, reason, m.target, now)
}

func describeMsg(m writeMsg) string {
	switch m.body {
	case bodyMerge:
		return "a merge patch of " + orObject(m.sub)
	case bodyAsRead:
		return "an update as read of " + orObject(m.sub)
	case bodyUnguard:
		return "a status patch removing the guard label"
	case bodyScale:
		return "a scale"
	case bodyNone:
		return "an eviction"
	}
	return "a write"
}

func orObject(sub string) string {
	if sub == "" {
		return "the object"
	}
	return sub
}
