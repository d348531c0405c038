package webhook

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// ctxHandler answers with what it sees of its context.
type ctxHandler struct{}

func (ctxHandler) Handle(ctx context.Context, _ admission.Request) admission.Response {
	if err := ctx.Err(); err != nil {
		return admission.Errored(500, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		return admission.Denied("no deadline")
	}
	return admission.Allowed("")
}

// A request accepted before the replica began to shut down is decided,
// within a deadline, although the webhook server's context (the manager's)
// is cancelled: a rolling update refuses nothing it accepted.
func TestFinishingOutlivesTheManagersContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if resp := (finishing{ctxHandler{}}).Handle(ctx, admission.Request{}); !resp.Allowed {
		t.Fatalf("a request in flight when the manager stopped: %+v, want it decided", resp.Result)
	}
	if resp := (ctxHandler{}).Handle(ctx, admission.Request{}); resp.Allowed {
		t.Fatal("without finishing the request is refused: the test cannot tell the difference")
	}
	start := time.Now()
	if resp := (finishing{ctxHandler{}}).Handle(t.Context(), admission.Request{}); !resp.Allowed || time.Since(start) > time.Second {
		t.Fatalf("a request in a live manager: %+v", resp.Result)
	}
}
