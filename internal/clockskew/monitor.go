package clockskew

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// DocumentedBound is the clock-skew bound between manager replicas that
// lockwarden's lease judgments assume (docs/ha.md).
const DocumentedBound = 250 * time.Millisecond

// Probe sends one request to the API server and returns its answer's Date
// header.
type Probe func(ctx context.Context) (time.Time, error)

// Monitor samples the API server's clock (Estimator), exports the offset
// of this replica's clock from it, logs when it is surely beyond Warn and
// fails Ready when it is surely beyond Max. It runs on every replica.
type Monitor struct {
	// Probe reads the API server's clock.
	Probe Probe
	// Clock is this replica's clock: the one that judges leases.
	Clock clock.Clock
	// Warn is the skew past which the monitor logs; 0: DocumentedBound.
	Warn time.Duration
	// Max is the skew past which Ready fails; 0 never fails it.
	Max time.Duration
	// Interval is how often the API server is sampled once the estimate
	// is as precise as the round trip allows; 0: every 10 s. Until then,
	// every second.
	Interval time.Duration

	mu  sync.Mutex
	est Estimator
	// beyondWarn, beyondMax: what was last logged.
	beyondWarn, beyondMax bool
	lastErr               error
}

var _ manager.LeaderElectionRunnable = (*Monitor)(nil)

// NeedLeaderElection is false: every replica judges leases by its clock.
func (*Monitor) NeedLeaderElection() bool { return false }

// Start samples until ctx ends.
func (m *Monitor) Start(ctx context.Context) error {
	interval := m.Interval
	if interval <= 0 {
		interval = 10 * time.Second
	}
	rtt := time.Duration(0)
	for {
		if d, err := m.Sample(ctx); err == nil {
			rtt = d
		}
		gap := interval
		if b, ok := m.Bound(); !ok || b.Uncertainty() > max(rtt, 5*time.Millisecond) {
			gap = time.Second
		}
		m.mu.Lock()
		next := m.est.Next(m.Clock.Now().Add(gap), rtt)
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-m.Clock.After(next.Sub(m.Clock.Now())):
		}
	}
}

// Sample reads the API server's clock once, adds the sample, updates the
// metrics and logs a change of verdict. It returns the round trip.
func (m *Monitor) Sample(ctx context.Context) (time.Duration, error) {
	log := logf.FromContext(ctx)
	sent := m.Clock.Now()
	date, err := m.Probe(ctx)
	received := m.Clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.lastErr == nil {
			log.Info("Cannot read the API server's clock", "error", err.Error())
		}
		m.lastErr = err
		return 0, err
	}
	m.lastErr = nil
	m.est.Add(Sample{Sent: sent, Received: received, Date: date})
	b, _ := m.est.Bound()
	offsetSeconds.Set(b.Offset().Seconds())
	uncertaintySeconds.Set(b.Uncertainty().Seconds())
	warn := m.Warn
	if warn <= 0 {
		warn = DocumentedBound
	}
	beyondWarn, beyondMax := b.Beyond(warn), m.Max > 0 && b.Beyond(m.Max)
	if beyondWarn != m.beyondWarn || beyondMax != m.beyondMax {
		kv := []any{"offset", b.Offset().String(), "uncertainty", b.Uncertainty().String(), "bound", warn.String(), "readinessBound", m.Max.String()}
		switch {
		case beyondMax:
			log.Info("This replica's clock is off the API server's beyond the readiness bound; the replica is not ready", kv...)
		case beyondWarn:
			log.Info("This replica's clock is off the API server's beyond the clock-skew bound leases assume", kv...)
		default:
			log.Info("This replica's clock is within the clock-skew bound again", kv...)
		}
		m.beyondWarn, m.beyondMax = beyondWarn, beyondMax
	}
	return received.Sub(sent), nil
}

// Bound returns the current estimate; false before the first sample.
func (m *Monitor) Bound() (Bound, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.est.Bound()
}

// ErrSkew is the readiness failure of a replica whose clock is surely
// beyond the readiness bound.
var ErrSkew = errors.New("clock skew beyond the bound")

// Ready is a readiness check: it fails while this replica's clock is
// surely more than Max ahead of or behind the API server's. Before the
// first sample, or when the API server cannot be read, it passes: a
// replica cut off from the API server fails its replica-lease check.
func (m *Monitor) Ready(*http.Request) error {
	if m.Max <= 0 {
		return nil
	}
	b, ok := m.Bound()
	if !ok || !b.Beyond(m.Max) {
		return nil
	}
	return fmt.Errorf("%w: this replica's clock is %s (±%s) off the API server's, more than %s", ErrSkew, b.Offset(), b.Uncertainty(), m.Max)
}

// APIServerProbe returns a Probe that reads the Date header of the API
// server's answer to GET /version, with cfg's credentials.
func APIServerProbe(cfg *rest.Config) (Probe, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	u, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, err
	}
	u.Path = "/version"
	url := u.String()
	return func(ctx context.Context) (time.Time, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return time.Time{}, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return time.Time{}, err
		}
		_ = resp.Body.Close()
		date, err := http.ParseTime(resp.Header.Get("Date"))
		if err != nil {
			return time.Time{}, fmt.Errorf("reading the API server's Date header: %w", err)
		}
		return date, nil
	}, nil
}

var (
	offsetSeconds = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockwarden_clock_skew_seconds",
		Help: "How far this replica's clock is ahead of the API server's (negative: behind), estimated from the Date header of the API server's answers.",
	})
	uncertaintySeconds = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockwarden_clock_skew_uncertainty_seconds",
		Help: "How far lockwarden_clock_skew_seconds may be from the real offset.",
	})
)

func init() { metrics.Registry.MustRegister(offsetSeconds, uncertaintySeconds) }
