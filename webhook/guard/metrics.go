package guard

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// decisions counts guarded-write decisions by outcome and reason code.
var decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "lockwarden_guarded_write_decisions_total",
	Help: "Guarded writes admitted or denied, by reason code (empty when admitted).",
}, []string{"decision", "reason", "operation"})

func init() {
	metrics.Registry.MustRegister(decisions)
}

func observe(req admission.Request, err error) {
	decision, reason := "admitted", ""
	if err != nil {
		decision, reason = "denied", string(fencing.ReasonOf(err))
		if reason == "" {
			decision, reason = "error", "INTERNAL"
		}
	}
	decisions.WithLabelValues(decision, reason, string(req.Operation)).Inc()
}
