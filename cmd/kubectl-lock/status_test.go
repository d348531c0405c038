package main

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// grantAt is a grant of resource requested at second sec, naming permits,
// in phase p; held in slot permit (when p is Held) with fence.
func grantAt(name, resource string, sec int, permits int32, p lockingv1alpha1.LockGrantPhase, permit *int32, fence int64) lockingv1alpha1.LockGrant {
	at := time.Date(2026, 7, 19, 0, 0, sec, 0, time.UTC)
	g := lockingv1alpha1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(at),
			Annotations: map[string]string{lockingv1alpha1.RequestedAtAnnotation: at.Format(time.RFC3339Nano)}},
		Spec:   lockingv1alpha1.LockGrantSpec{Resource: resource, Owner: "owner-" + name, Permits: permits},
		Status: lockingv1alpha1.LockGrantStatus{Phase: p, FenceToken: fence, Permit: permit},
	}
	if permit != nil {
		g.Status.FencedResource = lockingv1alpha1.SlotResource(resource, *permit)
	}
	return g
}

// status shows the limit in force (the newest live request's permits),
// every holder by permit with its fenced resource and fence, and the
// waiters in FIFO order; an exclusive lock looks as it always did.
func TestStatusOfPermits(t *testing.T) {
	const res = "render/farm"
	grants := []lockingv1alpha1.LockGrant{
		grantAt("w2", res, 6, 2, lockingv1alpha1.PhasePending, nil, 0),
		grantAt("h1", res, 2, 2, lockingv1alpha1.PhaseHeld, ptr.To[int32](1), 4),
		grantAt("w1", res, 5, 2, lockingv1alpha1.PhasePending, nil, 0),
		grantAt("h0", res, 3, 2, lockingv1alpha1.PhaseHeld, ptr.To[int32](0), 9),
		grantAt("old", res, 1, 2, lockingv1alpha1.PhaseReleased, ptr.To[int32](0), 8),
		grantAt("other", "render/other", 4, 1, lockingv1alpha1.PhaseHeld, ptr.To[int32](0), 30),
	}
	st := statusOf("ns", res, grants, &lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Fence: 9}})
	if st.Permits != 2 || len(st.Holders) != 2 || len(st.Queue) != 2 {
		t.Fatalf("permits %d, %d holders, %d waiting; want 2, 2, 2: %+v", st.Permits, len(st.Holders), len(st.Queue), st)
	}
	for i, want := range []struct {
		grant, fenced string
		permit        int32
		fence         int64
	}{{"h0", res, 0, 9}, {"h1", res + "#1", 1, 4}} {
		if h := st.Holders[i]; h.Grant != want.grant || h.FencedResource != want.fenced || h.Permit != want.permit || h.Fence != want.fence {
			t.Errorf("holder %d: %+v, want %+v", i, h, want)
		}
	}
	if st.Holder == nil || st.Holder.Grant != "h0" {
		t.Errorf("holder of permit 0: %+v, want h0", st.Holder)
	}
	if st.HighestFence != 9 {
		t.Errorf("highest fence of permit 0: %d, want 9 (permit 1's fences are another sequence)", st.HighestFence)
	}
	if st.Queue[0].Grant != "w1" || st.Queue[0].Position != 0 || st.Queue[1].Grant != "w2" || st.Queue[1].Position != 1 {
		t.Errorf("queue %+v, want w1 then w2", st.Queue)
	}

	// Each permit's highest fence comes from its own counter (permit 1's
	// counter has issued 6, beyond its holder's 4).
	st.addSlotFences(map[int32]*lockingv1alpha1.FenceCounter{1: {Spec: lockingv1alpha1.FenceCounterSpec{Fence: 6}}})
	if want := []slotFence{{0, res, 9}, {1, res + "#1", 6}}; !slices.Equal(st.SlotFences, want) {
		t.Errorf("highest fences %+v, want %+v", st.SlotFences, want)
	}

	var out bytes.Buffer
	printStatus(&app{streams: genericiooptions.IOStreams{Out: &out}}, st)
	t.Logf("\n%s", out.String())
	for _, want := range []string{"Permits:", "2 (2 held)", "PERMIT", "render/farm#1", "h1", "owner-h1", "Highest fences:", "permit 0: 9, permit 1: 6",
		"Queue:", "2 waiting", "POSITION", "REQUESTED AT", "w1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q", want)
		}
	}

	// The newest live request names the limit: lowered to 1, the holder of
	// permit 1 is over it.
	lowered := append(grants, grantAt("w3", res, 7, 1, lockingv1alpha1.PhasePending, nil, 0))
	lowered[1].Status.Conditions = []metav1.Condition{{Type: lockingv1alpha1.ConditionWithinLimit, Status: metav1.ConditionFalse, Reason: lockingv1alpha1.LockGrantReasonOverLimit}}
	st = statusOf("ns", res, lowered, nil)
	if st.Permits != 1 || !st.Holders[1].OverLimit || st.Holders[0].OverLimit {
		t.Errorf("after a request for 1 permit: limit %d, holders %+v; want 1 with permit 1 over it", st.Permits, st.Holders)
	}
	out.Reset()
	printStatus(&app{streams: genericiooptions.IOStreams{Out: &out}}, st)
	if !strings.Contains(out.String(), "1 (over the limit)") {
		t.Errorf("status output does not mark the holder over the limit:\n%s", out.String())
	}
}

func TestStatusOfExclusiveLock(t *testing.T) {
	const res = "db/orders"
	grants := []lockingv1alpha1.LockGrant{
		grantAt("h", res, 1, 0, lockingv1alpha1.PhaseHeld, nil, 3),
		grantAt("w", res, 2, 0, lockingv1alpha1.PhasePending, nil, 0),
	}
	st := statusOf("ns", res, grants, nil)
	if st.Permits != 1 || st.Holder == nil || st.Holder.Grant != "h" || st.Holder.FencedResource != res || st.HighestFence != 3 {
		t.Fatalf("exclusive status %+v", st)
	}
	var out bytes.Buffer
	printStatus(&app{streams: genericiooptions.IOStreams{Out: &out}}, st)
	for _, want := range []string{"Holder:", "h (owner owner-h)", "Fence:", "3", "Queue:", "1 waiting"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "Permits") || strings.Contains(out.String(), "PERMIT") {
		t.Errorf("an exclusive lock's status talks of permits:\n%s", out.String())
	}
}

// list's PERMIT column: the permit held of the permits requested, "-" for
// an exclusive lock.
func TestListPermitColumn(t *testing.T) {
	items := []lockingv1alpha1.LockGrant{
		grantAt("h1", "render/farm", 1, 4, lockingv1alpha1.PhaseHeld, ptr.To[int32](3), 2),
		grantAt("x", "db/orders", 2, 0, lockingv1alpha1.PhaseHeld, ptr.To[int32](0), 5),
	}
	var out bytes.Buffer
	printList(&app{streams: genericiooptions.IOStreams{Out: &out, ErrOut: &out}}, items, nil, false)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "PERMIT") {
		t.Fatalf("list printed:\n%s", out.String())
	}
	if f := strings.Fields(lines[1]); f[3] != "3/4" {
		t.Errorf("permit column of a held permit: %q in %q, want 3/4", f[3], lines[1])
	}
	if f := strings.Fields(lines[2]); f[3] != "-" {
		t.Errorf("permit column of an exclusive lock: %q in %q, want -", f[3], lines[2])
	}
}

// list --phase takes every phase of a LockGrant, Revoked included, and
// refuses a word that is none.
func TestListPhases(t *testing.T) {
	if got, want := phaseList(), "Pending, Held, Expired, Released, TimedOut or Revoked"; got != want {
		t.Errorf("phaseList() = %q, want %q", got, want)
	}
	cmd := (&app{}).listCmd()
	if u := cmd.Flags().Lookup("phase").Usage; !strings.Contains(u, "Revoked") {
		t.Errorf("--phase usage %q does not name Revoked", u)
	}
	cmd.SetArgs([]string{"--phase", "Gone"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "not a phase") {
		t.Errorf("list --phase Gone: %v, want a refusal", err)
	}
}
