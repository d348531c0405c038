package lock

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/http2"
	"k8s.io/client-go/rest"
)

// Health checks of the connections to the API server (ConfigureTransport).
const (
	// ReadIdleTimeout: a connection that received nothing for this long is
	// pinged (HTTP/2 PING).
	ReadIdleTimeout = time.Second
	// PingTimeout: a connection whose ping is not answered within this is
	// closed, and the requests and watches on it fail and are sent again.
	PingTimeout = time.Second
)

// ConfigureTransport returns a copy of cfg whose connections detect a dead
// peer within about two seconds: HTTP/2 health checks (a ping after
// ReadIdleTimeout without a frame, the connection closed after PingTimeout
// without an answer) and TCP keep-alives, instead of client-go's defaults
// (30 s and 15 s). Use it for the client given to NewClient: after a
// partition heals, a Handle whose watch and renewals sat on a dead
// connection learns the grant's state within a few seconds, well inside the
// safety margin, instead of waiting for the kernel to give up.
//
// cfg's TLS settings move into the transport; authentication (tokens,
// impersonation, exec plugins that return tokens) stays with cfg. It returns
// an error wrapping ErrInvalidOption when cfg's TLS settings cannot be used
// that way (an exec plugin that returns client certificates); use cfg as it
// is then.
func ConfigureTransport(cfg *rest.Config) (*rest.Config, error) {
	if cfg.Transport != nil {
		return nil, fmt.Errorf("%w: the config already has its own transport", ErrInvalidOption)
	}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	dial := (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 5 * time.Second}).DialContext
	if cfg.Dial != nil {
		dial = cfg.Dial
	}
	proxy := http.ProxyFromEnvironment
	if cfg.Proxy != nil {
		proxy = cfg.Proxy
	}
	t := &http.Transport{
		Proxy:               proxy,
		DialContext:         dial,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 25,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	h2, err := http2.ConfigureTransports(t)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	h2.ReadIdleTimeout, h2.PingTimeout = ReadIdleTimeout, PingTimeout

	out := rest.CopyConfig(cfg)
	out.TLSClientConfig = rest.TLSClientConfig{}
	out.Transport = t
	out.Dial, out.Proxy = nil, nil
	if _, err := rest.HTTPClientFor(out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return out, nil
}
