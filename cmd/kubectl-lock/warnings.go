package main

import (
	"net/http"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// withoutFailedCreateWarnings makes cfg's client drop the warnings of a
// create (POST) that the API server refused (any status but 2xx): they
// speak of an object that was not made. Admission runs before storage, so
// a create with a request ID whose window passed is warned about ("this
// request runs as a new attempt") even when it then fails because the grant
// of that request ID exists (AlreadyExists: acquire finds and prints that
// grant) or is refused. The warning is printed only with the grant it
// describes.
func withoutFailedCreateWarnings(cfg *rest.Config) {
	cfg.WrapTransport = transport.Wrappers(cfg.WrapTransport, func(rt http.RoundTripper) http.RoundTripper {
		return failedCreateWarnings{next: rt}
	})
}

// failedCreateWarnings removes the Warning headers of refused creates.
type failedCreateWarnings struct{ next http.RoundTripper }

func (t failedCreateWarnings) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost && (resp.StatusCode < 200 || resp.StatusCode > 299) {
		resp.Header.Del("Warning")
	}
	return resp, err
}
