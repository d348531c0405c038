package holder_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

// world is a discrete simulation of one holder and the controller, in real
// seconds. The controller's clock is real time. The holder's monotonic clock
// runs at rate times real time; its wall clock is offset seconds off and runs
// at the same rate. The holder only ever sees its monotonic clock.
type world struct {
	t      *testing.T
	ttl    float64
	rate   float64
	offset float64
	m      *holder.Machine

	// The registry's state, by the controller's clock.
	renewals, observed int64
	expiry             float64
	expired            bool

	// in-flight messages: renews on their way to the registry, and
	// observations on their way to the holder.
	renewsAt []struct {
		at     float64
		target int64
	}
	obsAt []struct {
		at float64
		f  holder.Facts
	}
	// net decides the delay of each message, or -1 to lose it.
	net func(now float64, toRegistry bool) float64
	// lastTry is the holder's last renew send, in real seconds.
	lastTry float64
	// validMs counts the milliseconds in which the holder could act.
	validMs int
	// firstValid is when the holder could first act (real seconds; 0:
	// never), with firstLeft the validity it had then (monotonic). lostMs
	// counts the milliseconds after firstValid in which it could not: a
	// handle is spent at the first of them.
	firstValid float64
	firstLeft  time.Duration
	lostMs     int
}

func (w *world) mono(r float64) holder.Mono { return sec(r * w.rate) }
func (w *world) wall(r float64) float64     { return r*w.rate + w.offset }

func (w *world) send(now float64, target int64) {
	if d := w.net(now, true); d >= 0 {
		w.renewsAt = append(w.renewsAt, struct {
			at     float64
			target int64
		}{now + d, target})
	}
	w.lastTry = now
}

func (w *world) observe(now float64) {
	f := holder.Facts{Phase: lockingv1alpha1.PhaseHeld, Fence: 1, Renewals: w.renewals, ObservedRenewals: w.observed}
	if w.expired {
		f = holder.Facts{Phase: lockingv1alpha1.PhaseExpired, Fence: 1, Renewals: w.renewals, ObservedRenewals: w.observed}
	}
	if d := w.net(now, false); d >= 0 {
		w.obsAt = append(w.obsAt, struct {
			at float64
			f  holder.Facts
		}{now + d, f})
	}
}

// step advances the world to real time now (in 1 ms steps) and checks the
// invariant: whenever the holder believes it may act, the controller's
// lease is live.
func (w *world) step(now float64) {
	// Registry: the lease runs out; renews arrive.
	if !w.expired && now >= w.expiry {
		w.expired = true
		w.observe(now)
	}
	var keep []struct {
		at     float64
		target int64
	}
	for _, r := range w.renewsAt {
		if r.at > now {
			keep = append(keep, r)
			continue
		}
		if r.target > w.renewals && !w.expired {
			w.renewals, w.observed = r.target, r.target
			w.expiry = now + w.ttl
			w.observe(now)
		}
	}
	w.renewsAt = keep
	// Holder: observations arrive; the clock ticks; renews go out.
	var keepObs []struct {
		at float64
		f  holder.Facts
	}
	for _, o := range w.obsAt {
		if o.at > now {
			keepObs = append(keepObs, o)
			continue
		}
		w.m.Observe(w.mono(now), o.f)
	}
	w.obsAt = keepObs
	mono := w.mono(now)
	w.m.Tick(mono)
	if at, ok := w.m.NextRenew(mono); ok && at <= mono {
		target, _ := w.m.RenewSent(mono)
		w.send(now, target)
	} else if _, _, pending := w.m.PendingRenew(); pending && now-w.lastTry >= 0.5 {
		target, _ := w.m.RenewSent(mono) // retry, same target
		w.send(now, target)
	}
	switch valid := w.m.Valid(mono); {
	case valid && w.firstValid == 0:
		w.firstValid = now
		d, _ := w.m.Deadline()
		w.firstLeft = time.Duration(d - mono)
		w.validMs++
	case valid:
		w.validMs++
	case w.firstValid != 0:
		w.lostMs++
	}
	if w.m.Valid(mono) && (w.expired || now >= w.expiry) {
		w.t.Fatalf("t=%.3f: the holder (wall clock %.3f) believes it holds, but the controller's lease ended at t=%.3f", now, w.wall(now), w.expiry)
	}
}

func runWorld(t *testing.T, rate float64, net func(now float64, toRegistry bool) float64, until float64) *world {
	// t=0: the create is sent; the controller grants at t=0.05 and the
	// holder reads the answer at t=0.1.
	return runWorldFrom(t, rate, net, 0.05, 0.1, until)
}

// runWorldFrom is runWorld with the create sent at t=0, granted at
// grantAt and the answer read by the holder at readAt.
func runWorldFrom(t *testing.T, rate float64, net func(now float64, toRegistry bool) float64, grantAt, readAt, until float64) *world {
	m, err := holder.New(holder.Config{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ttl: 10, rate: rate, offset: -30, m: m, net: net}
	w.m.Created(w.mono(0))
	w.m.Observe(w.mono(0.01), holder.Facts{Phase: lockingv1alpha1.PhasePending})
	w.expiry = grantAt + w.ttl
	w.obsAt = append(w.obsAt, struct {
		at float64
		f  holder.Facts
	}{readAt, holder.Facts{Phase: lockingv1alpha1.PhaseHeld, Fence: 1}})
	for ms := 1; float64(ms)/1000 <= until; ms++ {
		w.step(float64(ms) / 1000)
	}
	return w
}

// A grant that arrives late in the TTL, after waiting in the queue, is
// usable: it starts Held with at least TTL - margin - max(renew interval,
// its first renew's round trip) of validity, and a first renew slower than
// what the create's send time left does not make the holder give up a
// lease the controller granted in full. The
// deadline never outlives the controller's lease (step's invariant): a late
// grant's deadline counts from the send time of the renew that confirmed
// it, never from the grant's arrival.
func TestLateGrant(t *testing.T) {
	// Each network with the longest round trip a renew can take on it.
	type network struct {
		delay  func(now float64, toRegistry bool) float64
		maxRTT float64
	}
	nets := map[string]network{
		"prompt":               {func(float64, bool) float64 { return 0.02 }, 0.04},
		"slow (1.5s each way)": {func(float64, bool) float64 { return 1.5 }, 3},
		"slow requests (4s)": {func(_ float64, toRegistry bool) float64 {
			return map[bool]float64{true: 4, false: 0.02}[toRegistry]
		}, 4.02},
		"slow replies (3s)": {func(_ float64, toRegistry bool) float64 {
			return map[bool]float64{true: 0.02, false: 3}[toRegistry]
		}, 3.02},
		"jittery (0 to 3s)": {func(now float64, _ bool) float64 { return 1.5 + 1.5*math.Sin(now*7) }, 6},
	}
	for _, rate := range []float64{1.0, 1.5, 0.95} {
		for _, grantAt := range []float64{1, 3, 5, 6, 7.5, 8, 8.9, 9.5} {
			for name, net := range nets {
				t.Run(fmt.Sprintf("rate %.2fx, granted at %.1fs, %s", rate, grantAt, name), func(t *testing.T) {
					w := runWorldFrom(t, rate, net.delay, grantAt, grantAt+net.delay(grantAt, false), grantAt+40)
					if w.firstValid == 0 {
						t.Fatal("the holder never held the lease the controller granted")
					}
					// TTL - margin - max(renew interval, round trip), on
					// the holder's clock.
					if least := 9 - max(10.0/3, net.maxRTT*rate); w.firstLeft.Seconds() < least-0.002 {
						t.Fatalf("the holder started at t=%.3fs with %s of validity; want at least %.3fs", w.firstValid, w.firstLeft, least)
					}
					// A renew every third of the TTL keeps a lease when
					// its round trip is below TTL - margin - TTL/3; the
					// first one after a late grant is due at once, so it
					// must take at most half of TTL - margin.
					if w.lostMs > 0 && net.maxRTT*rate <= 9.0/2 {
						t.Fatalf("the holder could not act for %d ms after it first held (from t=%.3fs): it would have given up a lease the controller held for it", w.lostMs, w.firstValid)
					}
				})
			}
			t.Run(fmt.Sprintf("rate %.2fx, granted at %.1fs, replies lost after the grant", rate, grantAt), func(t *testing.T) {
				// Safety only (step checks it): the holder may never hold.
				runWorldFrom(t, rate, func(now float64, toRegistry bool) float64 {
					if !toRegistry && now > grantAt+0.5 {
						return -1
					}
					return 0.02
				}, grantAt, grantAt+0.02, grantAt+40)
			})
		}
	}
}

// The holder's wall clock is 30 s behind and runs 1.5x fast. Its local
// validity must end no later than the controller's expiry, under any
// network: the machine works on monotonic send times only, never on the
// wall clock and never on a reply's arrival.
func TestClockSkewAndRate(t *testing.T) {
	nets := map[string]func(now float64, toRegistry bool) float64{
		"prompt":            func(float64, bool) float64 { return 0.02 },
		"slow replies (3s)": func(_ float64, toRegistry bool) float64 { return map[bool]float64{true: 0.02, false: 3}[toRegistry] },
		"slow requests (4s)": func(_ float64, toRegistry bool) float64 {
			return map[bool]float64{true: 4, false: 0.02}[toRegistry]
		},
		"lost replies after t=5": func(now float64, toRegistry bool) float64 {
			if !toRegistry && now > 5 {
				return -1
			}
			return 0.02
		},
		"partition after t=5": func(now float64, _ bool) float64 {
			if now > 5 {
				return -1
			}
			return 0.02
		},
		"jittery": func(now float64, _ bool) float64 { return 1.5 + 1.5*math.Sin(now*7) },
	}
	for _, rate := range []float64{1.5, 1.0, 0.95, 2.0} {
		for name, net := range nets {
			t.Run(fmt.Sprintf("rate %.2fx, %s", rate, name), func(t *testing.T) {
				w := runWorld(t, rate, net, 40)
				if name == "prompt" && w.validMs < 39000 {
					t.Fatalf("with a prompt network the holder could act only %d of 40000 ms", w.validMs)
				}
				if name == "partition after t=5" {
					if s := w.m.State(); s != holder.OwnershipUnknown {
						t.Fatalf("after a partition: state %s, want OWNERSHIP_UNKNOWN", s)
					}
					if !w.expired {
						t.Fatal("the controller's lease never ended: a takeover would never happen")
					}
				}
			})
		}
	}

	// What the machine avoids: comparing the holder's wall clock with the
	// registry's expiresAt. With the clock 30 s behind, that check still
	// says "held" long after the lease ended.
	w := runWorld(t, 1.5, nets["partition after t=5"], 20)
	if naive := w.wall(20) < w.expiry; !naive {
		t.Fatalf("expected the wall-clock check to be fooled at t=20 (wall %.1f, expiresAt %.1f)", w.wall(20), w.expiry)
	}
}

// The margin is what absorbs a slow holder clock; below the documented rate
// (TTL-margin)/TTL = 0.9 with the default margin the bound no longer holds.
// This pins the assumption the package documents.
func TestSlowClockOutsideTheMargin(t *testing.T) {
	m, _ := holder.New(holder.Config{TTL: 10 * time.Second})
	const rate = 0.8
	m.Created(0)
	m.Observe(0, holder.Facts{Phase: lockingv1alpha1.PhaseHeld, Fence: 1})
	d, _ := m.Deadline()
	realEnd := time.Duration(d).Seconds() / rate
	if realEnd <= 10 {
		t.Fatalf("a 0.8x clock ends validity at real %.2fs; expected past the 10 s lease", realEnd)
	}
}
