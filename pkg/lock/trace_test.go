package lock_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// tracer keeps the steps a handle reports.
type tracer struct {
	mu     sync.Mutex
	events []lock.TraceEvent
	// h, once set, is called from inside the trace function: it may use
	// the handle it traces.
	h atomic.Pointer[lock.Handle]
}

func (tr *tracer) record(e lock.TraceEvent) {
	if h := tr.h.Load(); h != nil {
		_ = h.State()
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, e)
}

func (tr *tracer) all() []lock.TraceEvent {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]lock.TraceEvent(nil), tr.events...)
}

// last returns the last step of kind, and whether there is one.
func (tr *tracer) last(kind lock.TraceKind) (lock.TraceEvent, bool) {
	evs := tr.all()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == kind {
			return evs[i], true
		}
	}
	return lock.TraceEvent{}, false
}

func describe(evs []lock.TraceEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %s %s->%s fence %d renewals %d err %v renewErr %v", e.Kind, e.Previous, e.State, e.Fence, e.Renewals, e.Err, e.RenewErr)
	}
	return b.String()
}

// A handle with WithTrace reports what its holder believed and when: HELD
// with the fence and the local deadline counted from the create's send
// time, each renew sent and answered (a renew of unknown outcome is resent
// with the same renewals value), the deadline moved by the
// confirmed renew, OWNERSHIP_UNKNOWN and the Context's end at that deadline once renews
// stop getting through, and the release. The trace function may use the
// handle.
func TestTrace(t *testing.T) {
	ns := namespace(t)
	hclk := clocktesting.NewFakeClock(clk.Now())
	step := func(d time.Duration) {
		clk.Step(d)
		hclk.Step(d)
	}
	start := hclk.Now()
	tr := &tracer{}
	fa := &faulty{WithWatch: as(t, "trace-a")}
	h, err := newTestClient(t, fa, lock.WithNamespace(ns), lock.WithClock(hclk)).Acquire(t.Context(), "ledger/trace",
		lock.WithTTL(9*time.Second), // margin 1 s, renew every 3 s
		lock.WithTrace(tr.record))
	if err != nil {
		t.Fatal(err)
	}
	tr.h.Store(h)
	// Held once Acquire returned, with the fence and the deadline.
	eventually(t, "the trace reports HELD", func() bool {
		e, ok := tr.last(lock.TraceState)
		return ok && e.State == holder.Held
	})
	held, _ := tr.last(lock.TraceState)
	if held.Previous != holder.Requested || held.Fence != h.Info().Fence || held.Fence == 0 || held.Grant != h.Info().Grant ||
		held.UID != h.Info().UID || held.Resource != "ledger/trace" || held.Err != nil {
		t.Fatalf("the first state step: %+v; want REQUESTED->HELD with the handle's grant, UID and fence %d", held, h.Info().Fence)
	}
	// Deadline: create sent at start + TTL - margin (8 s).
	if want := start.Add(8 * time.Second); !held.Deadline.Equal(want) {
		t.Fatalf("HELD deadline %s, want %s (create's send time + 8s)", held.Deadline, want)
	}

	// The first renew is answered 409 Conflict, unapplied: its outcome is
	// unknown, and it is resent with the same value.
	fa.mu.Lock()
	fa.conflictRenews = 1
	fa.mu.Unlock()
	step(3 * time.Second)
	for round := 0; !h.Settled(); round++ {
		if round == 10 {
			t.Fatalf("the renew never settled; trace:%s", describe(tr.all()))
		}
		_ = waitUntil(t, 500*time.Millisecond, h.Settled)
		if !h.Settled() {
			step(500 * time.Millisecond)
		}
	}
	var sent, answered []lock.TraceEvent
	for _, e := range tr.all() {
		switch e.Kind {
		case lock.TraceRenewSent:
			sent = append(sent, e)
		case lock.TraceRenewAnswered:
			answered = append(answered, e)
		}
	}
	if len(sent) != 2 || sent[0].Renewals != 1 || sent[1].Renewals != 1 || len(answered) != 2 ||
		answered[0].RenewErr == nil || answered[1].RenewErr != nil || answered[1].Renewals != 1 {
		t.Fatalf("renew steps: sent %d, answered %d; want renewals 1 sent twice, the first of unknown outcome, the second accepted; trace:%s",
			len(sent), len(answered), describe(tr.all()))
	}
	// The deadline moved to the first attempt's send time (+3 s) + 8 s.
	eventually(t, "the trace reports the renewed deadline", func() bool {
		e, ok := tr.last(lock.TraceState)
		return ok && e.State == holder.Held && e.Deadline.Equal(start.Add(11*time.Second))
	})

	// Renews stop getting through: at the deadline the holder stops.
	fa.hold()
	defer fa.open()
	step(3 * time.Second) // the next renew is sent at +6.5 s or so, and held up
	step(5 * time.Second) // past the deadline (+11 s), before the controller's expiry (+12 s)
	eventually(t, "the trace reports the Context's end", func() bool {
		_, ok := tr.last(lock.TraceDone)
		return ok
	})
	unknown, _ := tr.last(lock.TraceState)
	done, _ := tr.last(lock.TraceDone)
	if unknown.State != holder.OwnershipUnknown || !errors.Is(unknown.Err, lock.ErrOwnershipUnknown) ||
		!unknown.Deadline.Equal(start.Add(11*time.Second)) || unknown.Fence != h.Info().Fence {
		t.Fatalf("at the deadline: %+v; want OWNERSHIP_UNKNOWN, Err ErrOwnershipUnknown, the deadline +11s, the fence", unknown)
	}
	if !errors.Is(done.Err, lock.ErrOwnershipUnknown) || done.State != holder.OwnershipUnknown || done.Time.Before(unknown.Time) {
		t.Fatalf("Done step: %+v; want Err ErrOwnershipUnknown in OWNERSHIP_UNKNOWN, after the state step", done)
	}

	release(t, h, "") // the renew is still held up

	eventually(t, "the trace reports RELEASED", func() bool {
		e, ok := tr.last(lock.TraceState)
		return ok && e.State == holder.Released
	})
	rel, _ := tr.last(lock.TraceState)
	if rel.Previous != holder.OwnershipUnknown || rel.Reason != fencing.ReasonReleased {
		t.Fatalf("the release: %+v; want OWNERSHIP_UNKNOWN->RELEASED, reason RELEASED", rel)
	}
	evs := tr.all()
	dones := 0
	for i, e := range evs {
		if e.Kind == lock.TraceDone {
			dones++
		}
		if i > 0 && e.Time.Before(evs[i-1].Time) {
			t.Fatalf("steps out of order at %d; trace:%s", i, describe(evs))
		}
	}
	if dones != 1 {
		t.Fatalf("the Context's end reported %d times; trace:%s", dones, describe(evs))
	}
}

// WithTrace refuses a nil function.
func TestTraceNil(t *testing.T) {
	_, err := lock.NewClient(as(t, "trace-nil")).Acquire(t.Context(), "ledger/trace-nil", lock.WithTrace(nil))
	if !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("Acquire with a nil trace: %v, want ErrInvalidOption", err)
	}
}
