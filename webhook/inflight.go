package webhook

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// inFlightTimeout bounds a request's decision once it no longer follows the
// manager's cancellation; the API server waits for at most the webhook's
// timeoutSeconds (1) anyway.
const inFlightTimeout = 10 * time.Second

// finishing decides every request it accepted, also while the replica shuts
// down. controller-runtime's webhook server derives each request's context
// from the manager's, so on SIGTERM (a rolling update, a drain) the requests
// in flight would lose their reads of the registry and be refused with an
// error; the server's graceful shutdown waits for them instead.
type finishing struct{ admission.Handler }

// Handle implements admission.Handler.
func (f finishing) Handle(ctx context.Context, req admission.Request) admission.Response {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), inFlightTimeout)
	defer cancel()
	return f.Handler.Handle(ctx, req)
}

// finish makes w decide every request it accepts (finishing).
func finish(w *admission.Webhook) *admission.Webhook {
	w.Handler = finishing{w.Handler}
	return w
}
