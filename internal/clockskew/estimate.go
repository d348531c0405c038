package clockskew

import (
	"slices"
	"time"
)

// Sample is one answer of the API server: the local clock when the request
// was sent and when the answer arrived, and the answer's Date header (the
// server's clock at some instant in between, truncated to the second).
type Sample struct {
	Sent, Received, Date time.Time
}

// Bound is an interval the offset lies in: the local clock minus the
// server's, at the same instant (positive: the local clock is ahead).
type Bound struct {
	Low, High time.Duration
}

// Bound returns what s says of the offset. At an instant t between Sent
// and Received (local), the server read a time in [Date, Date+1s), so the
// offset t-server lies in (Sent-Date-1s, Received-Date].
func (s Sample) Bound() Bound {
	return Bound{Low: s.Sent.Sub(s.Date) - time.Second, High: s.Received.Sub(s.Date)}
}

// Offset is the middle of the interval: the estimate.
func (b Bound) Offset() time.Duration { return b.Low + (b.High-b.Low)/2 }

// Uncertainty is half the interval's width: how far the estimate may be
// from the offset.
func (b Bound) Uncertainty() time.Duration { return (b.High - b.Low) / 2 }

// Beyond reports whether the offset is surely more than bound from zero,
// ahead or behind.
func (b Bound) Beyond(bound time.Duration) bool { return b.Low > bound || b.High < -bound }

func (b Bound) intersect(o Bound) (Bound, bool) {
	r := Bound{Low: max(b.Low, o.Low), High: min(b.High, o.High)}
	return r, r.Low <= r.High
}

// Estimator intersects the bounds of the samples of the last Window. When
// they disagree (the local clock was stepped or drifted, or the answers
// came from API servers whose clocks differ), the oldest samples are
// dropped until the rest agree. Not safe for concurrent use.
type Estimator struct {
	// Window is how long a sample counts; 0 keeps samples for a minute.
	Window time.Duration

	samples []Sample
	// probes counts the requests Next timed.
	probes int
}

// Add records s, and drops samples older than the window (by s.Received)
// or that disagree with newer ones.
func (e *Estimator) Add(s Sample) {
	window := e.Window
	if window <= 0 {
		window = time.Minute
	}
	e.samples = append(e.samples, s)
	e.samples = slices.DeleteFunc(e.samples, func(o Sample) bool { return s.Received.Sub(o.Received) > window })
	// Keep the longest run of newest samples that agree.
	b := s.Bound()
	for i := len(e.samples) - 2; i >= 0; i-- {
		next, ok := b.intersect(e.samples[i].Bound())
		if !ok {
			e.samples = e.samples[i+1:]
			return
		}
		b = next
	}
}

// Bound returns the intersection of the samples' bounds; false before the
// first sample.
func (e *Estimator) Bound() (Bound, bool) {
	if len(e.samples) == 0 {
		return Bound{}, false
	}
	b := e.samples[0].Bound()
	for _, s := range e.samples[1:] {
		b, _ = b.intersect(s.Bound())
	}
	return b, true
}

// Next returns when to send the next request, at or after earliest, given
// the last round trip: timed so that, by the current estimate, the
// server's clock turns to a new second halfway through the request. Aimed
// at the middle of the interval the offset lies in, the answer splits it.
// Once the interval is as narrow as the round trip allows, every other
// request is aimed just past one of its ends instead: if the offset has
// moved out of the interval by more than half the round trip (the local
// clock was stepped or drifted), that answer disagrees with the older
// samples, which are then dropped (Add). A smaller move goes unnoticed
// until the older samples leave the window.
// Before any sample it returns earliest. Each call times one request.
func (e *Estimator) Next(earliest time.Time, rtt time.Duration) time.Time {
	b, ok := e.Bound()
	if !ok {
		return earliest
	}
	aim := b.Offset()
	if b.Uncertainty() <= max(rtt, time.Millisecond) {
		switch e.probes % 4 {
		case 1:
			aim = b.High + rtt/2 + time.Millisecond
		case 3:
			aim = b.Low - rtt/2 - time.Millisecond
		}
	}
	e.probes++
	// The server's next second boundary, in local time: server time =
	// local - offset.
	server := earliest.Add(-aim).Add(rtt / 2)
	boundary := server.Truncate(time.Second)
	if boundary.Before(server) {
		boundary = boundary.Add(time.Second)
	}
	return boundary.Add(aim).Add(-rtt / 2)
}
