// Command manager runs the lockwarden controller and its admission webhooks.
//
// In a cluster it runs as the Deployment in config/manager (two replicas,
// leader election on). Against a local or remote API server it runs as a
// process: `make run`, or `bin/manager --kubeconfig ...`.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/controllers/lockgrant"
	"github.com/lockwarden/lockwarden/internal/clockskew"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/internal/observe"
	"github.com/lockwarden/lockwarden/internal/version"
	lwwebhook "github.com/lockwarden/lockwarden/webhook"
	"github.com/lockwarden/lockwarden/webhook/guard"
)

// The manager's Secrets (webhook certificate, signing keys) live in its own
// namespace: a Role there, not a ClusterRole. config/ and the Helm chart
// bind it in the namespace they install into.
// The manager creates the webhook certificate Secret when it is missing.
// +kubebuilder:rbac:groups="",namespace=lockwarden-system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations;mutatingwebhookconfigurations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// Secure metrics: the manager asks the API server who a scraper is and
// whether it may read /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

type options struct {
	metricsAddr, probeAddr  string
	metricsSecure           bool
	metricsCertDir          string
	enableHTTP2             bool
	leaderElect             bool
	leaderElectionNamespace string
	webhookHost             string
	webhookPort             int
	certDir                 string
	certSecret              string
	certSync                bool
	dnsName                 string
	mutatingConfig          string
	validatingConfig        string
	retention               time.Duration
	requestIDWindow         time.Duration
	floorScanInterval       time.Duration
	namespace               string
	leaseDuration           time.Duration
	renewDeadline           time.Duration
	retryPeriod             time.Duration
	grantsOnEveryReplica    bool
	replicaID               string
	takeoverDelay           time.Duration
	replicaLeaseDuration    time.Duration
	replicaLeaseRenew       time.Duration
	maxClockSkew            time.Duration
	guardReads              string
}

func main() {
	var o options
	var showVersion bool
	flag.BoolVar(&showVersion, "version", false, "Print the version and exit.")
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address the Prometheus metrics endpoint binds to; \"0\" disables it.")
	flag.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS, only to clients that authenticate and are authorized (TokenReview and SubjectAccessReview: get on the non-resource URL /metrics, e.g. the metrics-reader ClusterRole). false serves plain HTTP to anyone, for a manager on a developer's machine.")
	flag.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "Directory with tls.crt and tls.key for the metrics server (e.g. from cert-manager). Default: a self-signed certificate generated at start.")
	flag.BoolVar(&o.enableHTTP2, "enable-http2", false, "Serve HTTP/2 on the webhook and metrics servers. Off by default: HTTP/2 is open to the Rapid Reset and Stream Cancellation attacks (CVE-2023-44487, CVE-2023-39325).")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz probes bind to.")
	flag.BoolVar(&o.leaderElect, "leader-elect", false, "Elect one active controller among replicas (webhooks serve on every replica).")
	flag.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: --namespace).")
	flag.StringVar(&o.webhookHost, "webhook-host", "", "Address the webhook server binds to (default: all interfaces).")
	flag.IntVar(&o.webhookPort, "webhook-port", 9443, "Port the webhook server listens on.")
	flag.StringVar(&o.certDir, "webhook-cert-dir", "", "Directory of the webhook serving certificate (tls.crt, tls.key), e.g. where the certificate Secret is mounted. Default: a temporary directory that the manager fills from --webhook-cert-secret (for a manager running outside a pod).")
	flag.StringVar(&o.certSecret, "webhook-cert-secret", "", "Secret (NAME or NAMESPACE/NAME) in which the manager generates and rotates its own webhook CA and certificate, injecting the CA into the webhook configurations. Empty: certificates in --webhook-cert-dir are managed by someone else.")
	flag.BoolVar(&o.certSync, "webhook-cert-sync", false, "Write the certificate from --webhook-cert-secret into --webhook-cert-dir whenever the Secret changes, instead of waiting for the kubelet to project a Secret volume mounted there (up to its syncFrequency, 1 minute by default, on a first install and after every rotation): mount a writable emptyDir at --webhook-cert-dir. Needs --webhook-cert-secret.")
	flag.StringVar(&o.dnsName, "webhook-dns-name", "localhost", "DNS name the API server uses to reach the webhook server; it goes into the generated certificate.")
	flag.StringVar(&o.mutatingConfig, "mutating-webhook-configuration", "lockwarden-mutating-webhook-configuration", "MutatingWebhookConfiguration to inject the CA into.")
	flag.StringVar(&o.validatingConfig, "validating-webhook-configuration", "lockwarden-validating-webhook-configuration", "ValidatingWebhookConfiguration to inject the CA into.")
	flag.DurationVar(&o.retention, "finished-grant-retention", time.Hour, "How long a LockGrant is kept after it ended (Released, Expired, TimedOut) before it is deleted; 0 keeps them forever.")
	flag.DurationVar(&o.requestIDWindow, "request-id-window", 7*24*time.Hour, "How long a request ID stays spent after its grant ended, however long the grant itself is kept: a new LockGrant with it is refused (ALREADY_ENDED, EXPIRED, REVOKED) for this long, and for as long again after it is admitted with a warning as a new attempt. The IDs are recorded in each namespace's RequestIDLedger before finished grants are deleted; 0 records none.")
	flag.DurationVar(&o.floorScanInterval, "fence-floor-scan-interval", 30*time.Minute, "How often the manager lists the metadata of every object of every kind it may list for the fences guarded objects recorded (annotation locking.lockwarden.io/accepted-fence), after the scan at start: no grant is issued a fence at or below one of them (a FenceCounter behind its objects after a reinstall or a restore is held back with FenceRegression, naming the epoch to raise to). 0 scans only at start.")
	flag.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "How long a standby replica waits before taking over from a leader that stopped renewing: the longest pause in key generation and GuardPolicy webhook updates after a leader dies (and in granting, with --grants-on-every-replica=false).")
	flag.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "How long the leader retries renewing its leadership before it stops leading.")
	flag.DurationVar(&o.retryPeriod, "leader-election-retry-period", 2*time.Second, "How often replicas try to acquire or renew leadership.")
	flag.BoolVar(&o.grantsOnEveryReplica, "grants-on-every-replica", true, "Run the LockGrant controller (grants, renewals, expiries, releases) and the gated-Pod controller on every replica, not only on the elected leader, so that a replica that dies or freezes does not pause granting until a failover (docs/ha.md). Key generation and GuardPolicy webhooks stay with the leader.")
	flag.StringVar(&o.replicaID, "replica-id", defaultReplicaID(), "This replica's identity among the replicas that grant: its Lease is lockwarden-replica-ID in --namespace (default: $POD_NAME, else the host name and process ID).")
	flag.DurationVar(&o.takeoverDelay, "takeover-delay", 400*time.Millisecond, "With --grants-on-every-replica: how long a replica leaves a resource to the replica preferred for it (by hashing the resource over the replicas whose Lease is live) before acting itself, when the resource's state has not moved. The longest extra wait of a grant or expiry while a replica is frozen or cut off, until its Lease lapses. 0: every replica acts on every event at once (twice the work with two replicas). See docs/ha.md.")
	flag.DurationVar(&o.replicaLeaseDuration, "replica-lease-duration", 2*time.Second, "How long a replica's own Lease lasts after each renewal (whole seconds): after a replica stops renewing it (frozen, killed, partitioned), the others act at once on its resources.")
	flag.DurationVar(&o.replicaLeaseRenew, "replica-lease-renew-interval", 500*time.Millisecond, "How often a replica renews its own Lease; must be shorter than --replica-lease-duration.")
	flag.DurationVar(&o.maxClockSkew, "max-clock-skew", 2*clockskew.DocumentedBound, "How far this replica's clock may be from the API server's before the replica reports not ready (/readyz check clock-skew), judged from the API server's Date headers with the measurement's uncertainty subtracted. The default is twice the 250ms lease judgments assume between replicas, so that a replica fails only when the assumption is surely broken even if the API server's own clock is 250ms off; past 250ms the replica logs it. The offset is the metric lockwarden_clock_skew_seconds. 0: never fail readiness for it.")
	flag.StringVar(&o.guardReads, "guard-reads", string(guard.ReadsCached), "Where the guarded-write webhooks read the resource's FenceCounter. \"cached\": a write is accepted from this replica's informer cache when the counter there names the claimed grant, with its fence and a lease end not passed by this replica's clock; anything else, every refusal included, is decided again on a direct read from the API server. A release, revocation, forced release or lapsed session then takes effect in admission after this replica's watch lag (milliseconds; never after the lease end the cache recorded) instead of at the counter's swap, and a successor's write is never refused for the lag. \"direct\": every decision reads the API server (one more request per guarded write). See docs/grant-path.md.")
	flag.StringVar(&o.namespace, "namespace", defaultNamespace(), "The manager's namespace, where the signing keys Secret and the trust bundle ConfigMap live (default: $POD_NAMESPACE, else lockwarden-system).")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if showVersion {
		fmt.Println("lockwarden manager", version.Get())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	metrics.Registry.MustRegister(version.BuildInfo())

	if err := run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), o); err != nil {
		ctrl.Log.Error(err, "Manager stopped")
		os.Exit(1)
	}
}

// managerOptions are the manager's options: its scheme and caches, its
// metrics and probe endpoints, leader election, and its webhook server.
func managerOptions(scheme *runtime.Scheme, o options) ctrl.Options {
	tlsOpts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = tls.VersionTLS12 }}
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure, TLSOpts: tlsOpts}
	if o.metricsSecure {
		// As the kubebuilder scaffold: TokenReview and
		// SubjectAccessReview decide who may read /metrics.
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
		metricsOpts.CertDir = o.metricsCertDir
	}
	return ctrl.Options{
		Scheme: scheme,
		// Secrets and ConfigMaps are read only in the manager's namespace.
		Cache: cache.Options{
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Secret{}:    {Namespaces: map[string]cache.Config{o.namespace: {}}},
				&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{o.namespace: {}}},
				// Leases: only client sessions (spec.session of LockGrants).
				&coordinationv1.Lease{}: {Label: labels.SelectorFromSet(labels.Set{lockingv1alpha1.SessionLabel: "true"})},
			},
			// No reader of the cache uses managedFields (every write
			// sends none, which keeps the stored ones): they are most of a
			// small object's bytes, decoded and kept for every version.
			DefaultTransform: cache.TransformStripManagedFields(),
		},
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "lockwarden.locking.lockwarden.io",
		LeaderElectionNamespace:       cmp.Or(o.leaderElectionNamespace, o.namespace),
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		// The webhook server is added to the manager once its certificate
		// exists (see below).
		WebhookServer: observe.TimedWebhookServer{Server: webhook.NewServer(webhook.Options{
			Host:    o.webhookHost,
			Port:    o.webhookPort,
			CertDir: o.certDir,
			TLSOpts: tlsOpts,
		})},
	}
}

// run runs the manager against the API server cfg names until ctx ends.
func run(ctx context.Context, cfg *rest.Config, o options) error {
	reads, err := guard.ParseReads(cmp.Or(o.guardReads, string(guard.ReadsCached)))
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))

	// Without --webhook-cert-dir the manager runs outside a pod: it keeps
	// its certificate in a temporary directory, filled from the Secret. With
	// --webhook-cert-sync it fills the directory it was given, in a pod
	// without waiting for the kubelet.
	syncCerts := o.certDir == "" || o.certSync
	if o.certSync && o.certSecret == "" {
		return fmt.Errorf("--webhook-cert-sync needs --webhook-cert-secret")
	}
	if o.certDir == "" {
		dir, err := os.MkdirTemp("", "lockwarden-webhook-certs-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.certDir = dir
	}
	mgr, err := ctrl.NewManager(cfg, managerOptions(scheme, o))
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	certsReady := make(chan struct{})
	if o.certSecret != "" {
		key, err := addCertRotator(mgr, o, certsReady)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		// The rotator cannot start without its Secret: create it first
		// if it is missing, and again whenever it is deleted.
		keeper := &certSecret{clientset: cs, key: key, webhookConfig: o.validatingConfig, recorder: mgr.GetEventRecorder("lockwarden")}
		if _, err := keeper.ensure(ctx, metav1.ObjectMeta{}); err != nil {
			return err
		}
		if err := mgr.Add(keeper); err != nil {
			return err
		}
		if syncCerts {
			if err := mgr.Add(&certSync{clientset: cs, secret: key, dir: o.certDir}); err != nil {
				return err
			}
		}
	} else {
		close(certsReady)
	}

	clk := clock.RealClock{}
	keyring := &issuer.Keyring{Reader: mgr.GetClient(), Namespace: o.namespace}
	if err := controllers.Setup(ctx, mgr, controllers.Options{
		Clock: clk, Keyring: keyring, Namespace: o.namespace,
		FinishedGrantRetention: o.retention, RequestIDWindow: o.requestIDWindow, WebhookConfiguration: o.validatingConfig,
		GrantsOnEveryReplica: o.grantsOnEveryReplica, FloorScanInterval: o.floorScanInterval,
		Replica: controllers.ReplicaOptions{
			ID: o.replicaID, TakeoverDelay: o.takeoverDelay,
			LeaseDuration: o.replicaLeaseDuration, LeaseRenew: o.replicaLeaseRenew,
		},
	}); err != nil {
		return err
	}
	if err := mgr.Add(&observe.GrantObserver{Cache: mgr.GetCache()}); err != nil {
		return err
	}
	// The webhook server starts when it is first registered, which must
	// wait for its certificate to exist; the manager starts runnables added
	// after its own start at once.
	webhooksUp := make(chan struct{})
	go func() {
		select {
		case <-certsReady:
		case <-ctx.Done():
			return
		}
		if err := lwwebhook.Setup(mgr, clk, keyring.TrustBundle, o.requestIDWindow, reads); err != nil {
			cancel(fmt.Errorf("setting up webhooks: %w", err))
			return
		}
		close(webhooksUp)
	}()
	// Leases are judged by this replica's clock: measure it against the
	// API server's, and leave the Service when it is surely far off.
	probe, err := clockskew.APIServerProbe(cfg)
	if err != nil {
		return err
	}
	skew := &clockskew.Monitor{Probe: probe, Clock: clock.RealClock{}, Max: o.maxClockSkew}
	if err := mgr.Add(skew); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("clock-skew", skew.Ready); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhooks", func(req *http.Request) error {
		select {
		case <-webhooksUp:
			return mgr.GetWebhookServer().StartedChecker()(req)
		default:
			return errors.New("webhook certificate not ready yet")
		}
	}); err != nil {
		return err
	}
	ctrl.Log.Info("Starting manager", "version", version.Get().Version, "revision", version.Get().Revision, "webhookPort", o.webhookPort, "leaderElection", o.leaderElect, "grantsOnEveryReplica", o.grantsOnEveryReplica, "replicaID", o.replicaID, "takeoverDelay", o.takeoverDelay, "maxClockSkew", o.maxClockSkew, "guardReads", reads)
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return nil
}

func defaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "lockwarden-system"
}

// defaultReplicaID is the pod's name, else the host name and process ID
// (several replicas on one machine).
func defaultReplicaID() string {
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return lockgrant.ReplicaID(pod)
	}
	host, _ := os.Hostname()
	return lockgrant.ReplicaID(fmt.Sprintf("%s-%d", host, os.Getpid()))
}

func addCertRotator(mgr ctrl.Manager, o options, ready chan struct{}) (types.NamespacedName, error) {
	key := types.NamespacedName{Namespace: o.namespace, Name: o.certSecret}
	if ns, name, ok := strings.Cut(o.certSecret, "/"); ok {
		key = types.NamespacedName{Namespace: ns, Name: name}
	}
	return key, rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      key,
		CertDir:        o.certDir,
		CAName:         "lockwarden-ca",
		CAOrganization: "lockwarden",
		DNSName:        o.dnsName,
		IsReady:        ready,
		Webhooks: []rotator.WebhookInfo{
			{Name: o.mutatingConfig, Type: rotator.Mutating},
			{Name: o.validatingConfig, Type: rotator.Validating},
		},
		RequireLeaderElection: false,
	})
}
