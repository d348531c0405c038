package observe

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

var admissionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name: "lockwarden_admission_duration_seconds",
	Help: "Seconds the manager took to answer an admission request, by webhook path.",
	// Admission answers within the API server's 10 s webhook timeout.
	Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
}, []string{"webhook"})

func init() { metrics.Registry.MustRegister(admissionDuration) }

// TimedWebhookServer is a webhook.Server whose handlers are timed into
// lockwarden_admission_duration_seconds, labeled with the path they were
// registered at.
type TimedWebhookServer struct {
	webhook.Server
}

var _ webhook.Server = TimedWebhookServer{}

// Register registers hook at path, timed.
func (s TimedWebhookServer) Register(path string, hook http.Handler) {
	h := admissionDuration.WithLabelValues(path)
	s.Server.Register(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		defer func() { h.Observe(time.Since(start).Seconds()) }()
		hook.ServeHTTP(w, r)
	}))
}
