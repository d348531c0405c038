package grantplan

import (
	"crypto/ed25519"
	"math"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func fenceIn(epoch, seq int64) int64 { return epoch<<fencing.EpochBits | seq }

// heldBackAs checks that the plan grants nothing, writes no counter, and
// tells the head of the queue why (a Ready condition with reason, naming
// what the operator must do), with one Warning Event also sent regarding
// the FenceIssuer. It returns the head as the plan leaves it.
func heldBackAs(t *testing.T, p Plan, head, reason, says string) lockingv1alpha1.LockGrant {
	t.Helper()
	if len(p.Granted) != 0 || p.Counter != nil || len(p.SlotCounters) != 0 {
		t.Fatalf("granted %v, counter %+v, slots %+v; want the head held back", grantedNames(p), p.Counter, p.SlotCounters)
	}
	var g *lockingv1alpha1.LockGrant
	for _, s := range p.Statuses {
		if s.Name == head {
			g = s
		}
	}
	if g == nil {
		t.Fatalf("the head %s is not told: statuses %v", head, p.Statuses)
	}
	c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady)
	if g.Status.Phase != lockingv1alpha1.PhasePending || c == nil || c.Reason != reason || !strings.Contains(c.Message, says) {
		t.Fatalf("head %s: phase %s, Ready %+v; want Pending, reason %s saying %q", head, g.Status.Phase, c, reason, says)
	}
	var events []Event
	for _, e := range p.Events {
		if e.Grant.Name == head {
			events = append(events, e)
		}
	}
	if len(events) != 1 || !events[0].Warning || !events[0].Issuer || events[0].Reason != reason || events[0].Note != c.Message {
		t.Fatalf("events about %s = %+v; want one Warning %s, also regarding the FenceIssuer", head, events, reason)
	}
	return *g
}

// A counter raised to the last fence of the issuer's epoch: the next
// grant is never given epoch+1<<40|0 (a fence whose epoch bits are not
// the issuer's, which revoking the issuer's epoch would miss). The head
// waits, told to raise the epoch; once the epoch is raised it is granted
// the first fence of the new epoch, signed with that epoch.
func TestDecideNeverCarriesIntoTheEpochBits(t *testing.T) {
	exhausted := fenceIn(3, fencing.MaxSequence)
	f := Facts{Now: sec(1), Resource: res, Counter: counter(exhausted, nil), Grants: []lockingv1alpha1.LockGrant{grant("b", 0, 5)}, Epoch: 3}
	p := Decide(f)
	b := heldBackAs(t, p, "b", lockingv1alpha1.LockGrantReasonSequenceExhausted, "spec.epoch to 4 or more")

	// The next pass, with the status as written: nothing to write, no
	// second Event.
	f.Now, f.Grants = sec(2), []lockingv1alpha1.LockGrant{b}
	if p := Decide(f); len(p.Statuses) != 0 || len(p.Events) != 0 || len(p.Granted) != 0 {
		t.Fatalf("a second pass wrote %d statuses, %d events, granted %v", len(p.Statuses), len(p.Events), grantedNames(p))
	}

	f.Epoch = 4
	p = Decide(f)
	if len(p.Granted) != 1 || p.Counter == nil || p.Counter.Fence != fenceIn(4, 1) {
		t.Fatalf("after the epoch was raised: granted %v, counter %+v; want fence %d", grantedNames(p), p.Counter, fenceIn(4, 1))
	}
	key := issuer.Params{Epoch: 4, KeyID: "k", Key: testKey()}
	signed := Sign(p, key, "7")
	if len(signed) != 1 || signed[0].Grant != p.Granted[0] {
		t.Fatalf("signed %d records; want the new holder's", len(signed))
	}
	if r := signed[0].Record; r == nil || r.IssuerEpoch != 4 || r.FenceToken != fenceIn(4, 1) {
		t.Fatalf("record %+v; want fence %d signed as issuer epoch 4", r, fenceIn(4, 1))
	}
	if c := meta.FindStatusCondition(p.Granted[0].Status.Conditions, lockingv1alpha1.ConditionReady); c == nil || c.Reason != lockingv1alpha1.LockGrantReasonGranted {
		t.Fatalf("Ready %+v after the grant", c)
	}
}

// A counter an operator raised into a later epoch than the issuer's: no
// fence of the issuer's epoch is above it, and none of another epoch is
// issued. The head waits until the issuer reaches that epoch.
func TestDecideWaitsForTheEpochOfARaisedCounter(t *testing.T) {
	f := Facts{Now: sec(1), Resource: res, Counter: counter(fenceIn(5, 7), nil), Grants: []lockingv1alpha1.LockGrant{grant("b", 0, 5)}, Epoch: 3}
	heldBackAs(t, Decide(f), "b", lockingv1alpha1.LockGrantReasonEpochBehind, "spec.epoch to 5 or more")
	f.Epoch = 5
	if p := Decide(f); p.Counter == nil || p.Counter.Fence != fenceIn(5, 8) {
		t.Fatalf("at epoch 5: counter %+v, want fence %d", p.Counter, fenceIn(5, 8))
	}
}

// At the int64 end there is no later epoch: the head is told the resource
// can take no more grants, rather than waiting as Pending with no word.
func TestDecideAtTheInt64End(t *testing.T) {
	for _, epoch := range []int64{3, fencing.MaxEpoch} {
		p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(math.MaxInt64, nil), Grants: []lockingv1alpha1.LockGrant{grant("b", 0, 5)}, Epoch: epoch})
		reason := lockingv1alpha1.LockGrantReasonEpochBehind
		if epoch == fencing.MaxEpoch {
			reason = lockingv1alpha1.LockGrantReasonSequenceExhausted
		}
		heldBackAs(t, p, "b", reason, "use another resource ID")
	}
}

// Each slot of a resource with permits has its own fences: a slot whose
// epoch is used up is skipped for the next free one; only when none is
// left is the head held back.
func TestPermitsSkipASlotWithoutAFence(t *testing.T) {
	f := Facts{Now: sec(1), Resource: res, Epoch: 3,
		Counter:      slotCounter(0, fenceIn(3, fencing.MaxSequence), nil),
		SlotCounters: map[int32]*lockingv1alpha1.FenceCounter{1: slotCounter(1, fenceIn(3, 9), nil)},
		Grants:       []lockingv1alpha1.LockGrant{withPermits(grant("a", 0, 5), 2)},
	}
	p := Decide(f)
	if len(p.Granted) != 1 || p.Counter != nil || p.SlotCounters[1] == nil || p.SlotCounters[1].Fence != fenceIn(3, 10) {
		t.Fatalf("granted %v, slot 0 %+v, slot 1 %+v; want slot 1 with fence %d", grantedNames(p), p.Counter, p.SlotCounters[1], fenceIn(3, 10))
	}
	f.SlotCounters[1] = slotCounter(1, fenceIn(4, 1), nil)
	heldBackAs(t, Decide(f), "a", lockingv1alpha1.LockGrantReasonSequenceExhausted, "spec.epoch to 4 or more")
}

func testKey() ed25519.PrivateKey { return ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)) }

// A grant an earlier version made Held with a fence carried into the
// epoch bits (4<<40|0 while the issuer was at epoch 3) is revoked, at
// epoch 3 and once the issuer is at 4: revoking epoch 3 must not miss it.
func TestDecideRevokesAFenceCarriedIntoTheEpoch(t *testing.T) {
	carried := fenceIn(4, 0)
	for _, epoch := range []int64{3, 4} {
		a := held(grant("a", 0, 60), carried, 60)
		p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(carried, &a), Grants: []lockingv1alpha1.LockGrant{a}, Epoch: epoch, Revoked: []int64{0, 1, 2, 3}[:epoch]})
		if st := statusOf(p, "a"); st == nil || st.Phase != lockingv1alpha1.PhaseRevoked {
			t.Fatalf("at epoch %d the carried fence's grant is %+v; want Revoked", epoch, st)
		}
	}
	// A fence the issuer's epoch did issue stays.
	a := held(grant("a", 0, 60), fenceIn(3, 1), 60)
	if p := Decide(Facts{Now: sec(1), Resource: res, Counter: counter(fenceIn(3, 1), &a), Grants: []lockingv1alpha1.LockGrant{a}, Epoch: 3}); statusOf(p, "a") != nil && statusOf(p, "a").Phase != lockingv1alpha1.PhaseHeld {
		t.Fatalf("a fence of the issuer's epoch: %+v", statusOf(p, "a"))
	}
}

// A guarded object recorded fence F of the issuer's epoch, and the
// resource's counter is gone (a reinstall) or behind it (a restore): the
// head is never granted a fence at or below F. It waits, told which epoch
// to raise to and which object recorded F; once the epoch is raised it is
// granted the first fence of that epoch, above F.
func TestDecideNeverIssuesAtOrBelowARecordedFence(t *testing.T) {
	recorded := fenceIn(3, 40)
	floors := map[string]Floor{res: {Fence: recorded, Where: "ConfigMap billing/ledger-7"}}
	for _, c := range []*lockingv1alpha1.FenceCounter{nil, counter(fenceIn(3, 2), nil), counter(fenceIn(3, 39), nil)} {
		f := Facts{Now: sec(1), Resource: res, Counter: c, Grants: []lockingv1alpha1.LockGrant{grant("b", 0, 5)}, Epoch: 3, Floors: floors}
		p := Decide(f)
		b := heldBackAs(t, p, "b", fencing.ReasonFenceRegression.ConditionReason(), "spec.epoch to 4 or more")
		if c := meta.FindStatusCondition(b.Status.Conditions, lockingv1alpha1.ConditionReady); !strings.Contains(c.Message, "ConfigMap billing/ledger-7") {
			t.Fatalf("Ready %q does not name the object", c.Message)
		}
		f.Epoch = 4
		if p := Decide(f); len(p.Granted) != 1 || p.Counter == nil || p.Counter.Fence != fenceIn(4, 1) {
			t.Fatalf("at epoch 4: granted %v, counter %+v; want fence %d", grantedNames(p), p.Counter, fenceIn(4, 1))
		}
	}
	// A counter above the floor (the normal case: the object recorded a
	// fence the counter issued) grants as ever.
	f := Facts{Now: sec(1), Resource: res, Counter: counter(recorded, nil), Grants: []lockingv1alpha1.LockGrant{grant("b", 0, 5)}, Epoch: 3, Floors: floors}
	if p := Decide(f); len(p.Granted) != 1 || p.Counter.Fence != recorded+1 {
		t.Fatalf("a counter at the floor: granted %v, counter %+v", grantedNames(p), p.Counter)
	}
	// A slot's floor holds back that slot only: the head takes the next.
	f = Facts{Now: sec(1), Resource: res, Epoch: 3,
		Floors: map[string]Floor{lockingv1alpha1.SlotResource(res, 0): {Fence: recorded}},
		Grants: []lockingv1alpha1.LockGrant{withPermits(grant("a", 0, 5), 2)},
	}
	if p := Decide(f); len(p.Granted) != 1 || p.Counter != nil || p.SlotCounters[1] == nil || p.SlotCounters[1].Fence != fenceIn(3, 1) {
		t.Fatalf("slot 0 under a floor: granted %v, counter %+v, slots %+v; want slot 1 at fence %d", grantedNames(p), p.Counter, p.SlotCounters, fenceIn(3, 1))
	}
}
