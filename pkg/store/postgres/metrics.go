package postgres

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts the store's decisions. Create it once per registry with
// NewMetrics and pass it to every Store with WithMetrics.
type Metrics struct {
	segments    *prometheus.CounterVec
	regressions *prometheus.CounterVec
}

// NewMetrics registers the store's counters on reg:
//
//	lockwarden_store_segments_total{result}            result: applied, duplicate, or a refusal's reason code
//	lockwarden_store_fence_regressions_total{cluster,namespace,resource}  FENCE_REGRESSION refusals, the alarm to page on
//
// It returns the registration error (e.g. prometheus.AlreadyRegisteredError
// when called twice on one registry).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		segments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockwarden_store_segments_total",
			Help: "Segments the PostgreSQL store decided on, by result: applied, duplicate (answered with the original receipt) or the refusal's reason code.",
		}, []string{"result"}),
		regressions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockwarden_store_fence_regressions_total",
			Help: "Segments refused with FENCE_REGRESSION: the lock registry issued a fence the resource had already seen (restored from an old snapshot?).",
		}, []string{"cluster", "namespace", "resource"}),
	}
	for _, c := range []prometheus.Collector{m.segments, m.regressions} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observe(result string) {
	if m != nil {
		m.segments.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) regression(at ref) {
	if m != nil {
		m.regressions.WithLabelValues(at.Cluster, at.Namespace, at.resource).Inc()
	}
}
