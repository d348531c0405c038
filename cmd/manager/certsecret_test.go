package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The manager started while its webhook certificate Secret is missing (it
// was deleted while the replicas ran, then they were rolled out): it
// creates the Secret, says so in an Event, issues a CA and certificate
// into it and becomes ready (its clock measured against the API
// server's). The two rotations docs/runbook.md gives work:
// without its serving certificate the Secret gets a new one from the same
// CA; deleted while the manager runs, it is created again with a new CA;
// deleted after the webhook configuration (an uninstall), it stays gone.
func TestManagerCreatesAMissingCertificateSecret(t *testing.T) {
	const ns, name = "lockwarden-system", "webhook-server-cert"
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Setenv("KUBEBUILDER_ASSETS", filepath.Join(root, "bin"))
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	// The webhook configuration the rotator injects its CA into (with no
	// webhooks: nothing calls this manager).
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "lockwarden-validating-webhook-configuration"}}
	if err := c.Create(t.Context(), validating); err != nil {
		t.Fatal(err)
	}

	probe := freeAddr(t)
	o := options{
		metricsAddr: "0", probeAddr: probe, webhookHost: "127.0.0.1", webhookPort: freePort(t),
		certSecret: name, dnsName: "localhost", namespace: ns,
		mutatingConfig: "lockwarden-mutating-webhook-configuration", validatingConfig: "lockwarden-validating-webhook-configuration",
		retention: time.Hour, leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second,
		grantsOnEveryReplica: true, replicaID: "cert-test", takeoverDelay: 400 * time.Millisecond,
		replicaLeaseDuration: 2 * time.Second, replicaLeaseRenew: 500 * time.Millisecond, maxClockSkew: 500 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := &running{done: make(chan struct{})}
	go func() { stopped.err = run(ctx, cfg, o); close(stopped.done) }()
	t.Cleanup(func() {
		cancel()
		<-stopped.done
		if stopped.err != nil {
			t.Errorf("manager: %v", stopped.err)
		}
	})

	first := waitIssued(t, c, ns, name, nil, stopped)
	var events eventsv1.EventList
	waitUntil(t, "an Event says the Secret was created", stopped, func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == lockingv1alpha1.EventReasonCertificateSecretCreated && e.Regarding.Kind == "Secret" && e.Regarding.Name == name {
				return true, nil
			}
		}
		return false, nil
	})
	waitUntil(t, "the manager is ready (webhooks serving)", stopped, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+probe+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})

	// The replica measured its clock against the API server's (the same
	// machine's: no skew beyond the measurement's uncertainty).
	waitUntil(t, "the replica measured its clock against the API server's", stopped, func(context.Context) (bool, error) {
		offset, uncertainty := gauge("lockwarden_clock_skew_seconds"), gauge("lockwarden_clock_skew_uncertainty_seconds")
		if offset == nil || uncertainty == nil || *uncertainty == 0 {
			return false, nil
		}
		if d := math.Abs(*offset) - *uncertainty; d > 0.05 {
			return false, fmt.Errorf("offset %.3fs ±%.3fs from the API server on the same machine", *offset, *uncertainty)
		}
		return true, nil
	})

	// The runbook's rotation of the serving certificate alone: without
	// tls.crt and tls.key, the rotator issues a new certificate from the
	// same CA, which the webhook configurations already trust.
	patch := []byte(`[{"op":"remove","path":"/data/tls.crt"},{"op":"remove","path":"/data/tls.key"}]`)
	if err := c.Patch(t.Context(), first, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{}
	waitUntil(t, "a new serving certificate from the same CA", stopped, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(first), s); err != nil {
			return false, err
		}
		cert := s.Data[corev1.TLSCertKey]
		return len(cert) > 0 && !bytes.Equal(cert, first.Data[corev1.TLSCertKey]), nil
	})
	if !bytes.Equal(s.Data["ca.crt"], first.Data["ca.crt"]) {
		t.Fatal("removing the serving certificate rotated the CA too")
	}

	// The runbook's forced rotation of the CA: delete the Secret.
	if err := c.Delete(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	second := waitIssued(t, c, ns, name, first.Data["ca.crt"], stopped)

	// An uninstall deletes the webhook configuration, then the Secret:
	// the Secret is not created again behind it.
	if err := c.Delete(t.Context(), validating); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(t.Context(), second); err != nil {
		t.Fatal(err)
	}
	stays(t, "the Secret deleted after the webhook configuration stays deleted", 3*time.Second, func() bool {
		return apierrors.IsNotFound(c.Get(t.Context(), client.ObjectKeyFromObject(second), &corev1.Secret{}))
	})
}

// stays checks that cond holds throughout d.
func stays(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		if !cond() {
			t.Fatalf("%s: it changed", what)
		}
		select {
		case <-t.Context().Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// gauge reads a gauge from the manager's metrics registry; nil when it is
// not there.
func gauge(name string) *float64 {
	families, err := metrics.Registry.Gather()
	if err != nil {
		return nil
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			v := f.GetMetric()[0].GetGauge().GetValue()
			return &v
		}
	}
	return nil
}

// running is the outcome of run: done is closed when it returned err.
type running struct {
	done chan struct{}
	err  error
}

// waitIssued waits until the Secret holds a serving certificate and a CA
// other than notCA, and returns it.
func waitIssued(t *testing.T, c client.Client, ns, name string, notCA []byte, stopped *running) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	waitUntil(t, "the Secret holds a new CA and serving certificate", stopped, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		ca := s.Data["ca.crt"]
		return len(s.Data[corev1.TLSCertKey]) > 0 && len(ca) > 0 && !bytes.Equal(ca, notCA), nil
	})
	return s
}

// waitUntil polls cond for up to a minute, failing at once if the manager
// stopped.
func waitUntil(t *testing.T, what string, stopped *running, cond func(context.Context) (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-stopped.done:
			return false, errors.Join(errors.New("the manager stopped"), stopped.err)
		default:
		}
		ok, err := cond(ctx)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return ok, err
	})
	if err != nil {
		t.Fatalf("waiting until %s: %v", what, err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func freePort(t *testing.T) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(freeAddr(t))
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
