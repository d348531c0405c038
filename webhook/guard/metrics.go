package guard

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

var (
	// decisions counts guarded-write decisions by webhook, outcome and
	// reason code.
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_guarded_write_decisions_total",
		Help: "Guarded writes checked, by webhook (label, enforce, shadow), decision (admitted, denied, error) and reason code.",
	}, []string{"webhook", "decision", "reason", "operation"})

	// registryReads counts guarded-write decisions by where the registry's
	// facts that decided came from: the informer cache (an acceptance) or
	// a direct read.
	registryReads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_guarded_write_registry_reads_total",
		Help: "Guarded-write decisions on a grant, by where the FenceCounter that decided was read (cache: accepted from the informer, --guard-reads=cached; direct: read from the API server).",
	}, []string{"read"})

	// shadowDenials counts writes a Shadow policy admitted that Enforce
	// would have denied.
	shadowDenials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockwarden_guardpolicy_shadow_denials_total",
		Help: "Writes a GuardPolicy in Shadow mode admitted that Enforce would have denied, by policy and reason code.",
	}, []string{"policy", "reason"})
)

func init() {
	metrics.Registry.MustRegister(decisions, registryReads, shadowDenials)
}

// observe counts a guarded-write decision. A dry run is not counted: it
// is neither an admitted nor a denied write, and a denial it would have met
// (FENCE_REGRESSION, say) must not page anyone.
func observe(webhook string, req admission.Request, err error) {
	if dryRun(req) {
		return
	}
	decision, reason := "admitted", ""
	if err != nil {
		decision, reason = "denied", string(fencing.ReasonOf(err))
		if reason == "" {
			decision, reason = "error", string(fencing.ReasonInternal)
		}
	}
	decisions.WithLabelValues(webhook, decision, reason, string(req.Operation)).Inc()
}

// dryRun reports whether req is a dry run (dryRun=All, kubectl
// --dry-run=server): the API server persists nothing, and the webhooks,
// whose configurations promise no side effects on dry runs, leave no trace
// of it either: no metric, no Event, no log at the default level.
func dryRun(req admission.Request) bool {
	return ptr.Deref(req.DryRun, false)
}
