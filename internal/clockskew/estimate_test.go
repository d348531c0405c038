package clockskew

import (
	"fmt"
	"testing"
	"time"
)

// server answers a request sent at local time sent: the round trip is rtt,
// the server reads its clock at the fraction at of the way, and its clock
// is offset behind the local one.
func answer(sent time.Time, rtt time.Duration, at float64, offset time.Duration) Sample {
	read := sent.Add(time.Duration(at * float64(rtt)))
	return Sample{Sent: sent, Received: sent.Add(rtt), Date: read.Add(-offset).Truncate(time.Second)}
}

func TestSampleBoundHoldsTheOffset(t *testing.T) {
	base := time.Date(2026, 12, 3, 10, 0, 0, 123_000_000, time.UTC)
	for _, offset := range []time.Duration{0, 300 * time.Millisecond, -300 * time.Millisecond, 2*time.Second + 999*time.Millisecond, -5 * time.Second} {
		for _, at := range []float64{0, 0.5, 1} {
			b := answer(base, 40*time.Millisecond, at, offset).Bound()
			if offset < b.Low || offset > b.High {
				t.Errorf("offset %s, read at %.1f of the round trip: bound [%s, %s] misses it", offset, at, b.Low, b.High)
			}
		}
	}
}

// Requests timed by Next narrow the offset to about the round trip within
// a dozen samples, wherever in the round trip the server reads its clock,
// and the estimate never loses the true offset on the way.
func TestEstimatorNarrowsToTheRoundTrip(t *testing.T) {
	for _, offset := range []time.Duration{0, 180 * time.Millisecond, -260 * time.Millisecond, 1300 * time.Millisecond, -4*time.Second - 10*time.Millisecond} {
		for _, at := range []float64{0.1, 0.5, 0.9} {
			t.Run(fmt.Sprintf("%s@%.1f", offset, at), func(t *testing.T) {
				const rtt = 6 * time.Millisecond
				var e Estimator
				now := time.Date(2026, 12, 3, 10, 0, 0, 777_000_000, time.UTC)
				for i := range 12 {
					now = e.Next(now.Add(time.Second), rtt)
					e.Add(answer(now, rtt, at, offset))
					b, _ := e.Bound()
					if offset < b.Low || offset > b.High {
						t.Fatalf("sample %d: bound [%s, %s] misses the offset", i, b.Low, b.High)
					}
				}
				b, _ := e.Bound()
				if b.Uncertainty() > rtt {
					t.Fatalf("after 12 samples the offset is known within ±%s only, not the round trip %s", b.Uncertainty(), rtt)
				}
			})
		}
	}
}

// A clock that is stepped, by a little (more than the round trip) or a
// lot, either way, is followed: the samples before the step disagree with
// those after and are dropped.
func TestEstimatorFollowsAStep(t *testing.T) {
	const rtt = 4 * time.Millisecond
	for _, after := range []time.Duration{900 * time.Millisecond, 110 * time.Millisecond, 90 * time.Millisecond, -700 * time.Millisecond} {
		t.Run(after.String(), func(t *testing.T) {
			var e Estimator
			now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
			for range 12 {
				now = e.Next(now.Add(time.Second), rtt)
				e.Add(answer(now, rtt, 0.5, 100*time.Millisecond))
			}
			for range 16 {
				now = e.Next(now.Add(time.Second), rtt)
				e.Add(answer(now, rtt, 0.5, after))
			}
			if b, _ := e.Bound(); after < b.Low || after > b.High || b.Uncertainty() > rtt {
				t.Fatalf("16 samples after a step from 100ms to %s the bound is [%s, %s]", after, b.Low, b.High)
			}
		})
	}
}
