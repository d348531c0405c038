package clockskew

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeAPIServer answers with a Date from a server clock offset behind the
// replica's fake clock, after half the round trip, and the answer takes the
// other half.
func fakeAPIServer(local *clocktesting.FakeClock, offset, rtt time.Duration) Probe {
	return func(context.Context) (time.Time, error) {
		local.Step(rtt / 2)
		date := local.Now().Add(-offset).Truncate(time.Second)
		local.Step(rtt / 2)
		return date, nil
	}
}

// sample runs n samples of m, timed as Start times them.
func sample(t *testing.T, m *Monitor, local *clocktesting.FakeClock, n int) {
	t.Helper()
	for range n {
		rtt, err := m.Sample(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		m.mu.Lock()
		next := m.est.Next(local.Now().Add(time.Second), rtt)
		m.mu.Unlock()
		local.SetTime(next)
	}
}

// A replica whose clock is far off the API server's is not ready; one
// within the bound is, and the metric shows the offset either way.
func TestMonitorFailsReadinessBeyondTheBound(t *testing.T) {
	for _, tc := range []struct {
		offset time.Duration
		ready  bool
	}{
		{0, true},
		{200 * time.Millisecond, true},
		{-450 * time.Millisecond, true},
		{700 * time.Millisecond, false},
		{-1200 * time.Millisecond, false},
		{42 * time.Second, false},
	} {
		t.Run(tc.offset.String(), func(t *testing.T) {
			local := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 0, 0, 310_000_000, time.UTC))
			m := &Monitor{Probe: fakeAPIServer(local, tc.offset, 8*time.Millisecond), Clock: local, Max: 500 * time.Millisecond}
			if err := m.Ready(nil); err != nil {
				t.Fatalf("not ready before any sample: %v", err)
			}
			sample(t, m, local, 12)
			err := m.Ready(nil)
			if ready := err == nil; ready != tc.ready {
				t.Fatalf("ready: %v (%v), want %v", ready, err, tc.ready)
			}
			if err != nil && !errors.Is(err, ErrSkew) {
				t.Fatalf("readiness error %v is not ErrSkew", err)
			}
			var metric dto.Metric
			if err := offsetSeconds.Write(&metric); err != nil {
				t.Fatal(err)
			}
			got := time.Duration(metric.GetGauge().GetValue() * float64(time.Second))
			if d := got - tc.offset; d < -10*time.Millisecond || d > 10*time.Millisecond {
				t.Fatalf("lockwarden_clock_skew_seconds says %s, the offset is %s", got, tc.offset)
			}
		})
	}
}

// With Max 0 the monitor measures and logs but never fails readiness.
func TestMonitorWithoutReadinessBound(t *testing.T) {
	local := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	m := &Monitor{Probe: fakeAPIServer(local, 3*time.Second, 4*time.Millisecond), Clock: local}
	sample(t, m, local, 12)
	if err := m.Ready(nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := m.Bound(); !b.Beyond(DocumentedBound) {
		t.Fatalf("a 3 s offset is not beyond the documented bound: %+v", b)
	}
}

// The probe reads the Date header of the API server's answer.
func TestAPIServerProbeReadsTheDateHeader(t *testing.T) {
	date := time.Date(2026, 12, 3, 10, 11, 12, 0, time.UTC)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/version" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Date", date.Format(http.TimeFormat))
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	probe, err := APIServerProbe(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := probe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(date) {
		t.Fatalf("probe read %s, the server said %s", got, date)
	}
}
