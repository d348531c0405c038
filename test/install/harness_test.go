package install

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/test/envtest"
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

const (
	systemNamespace = "lockwarden-system"
	deploymentName  = "lockwarden-controller-manager"
	serviceAccount  = "lockwarden-controller-manager"
	pollInterval    = 200 * time.Millisecond
	waitLimit       = 90 * time.Second
)

var staticConfigs = []string{"lockwarden-mutating-webhook-configuration", "lockwarden-validating-webhook-configuration"}

// cluster is a local control plane with no lockwarden installed.
type cluster struct {
	t       *testing.T
	root    string
	dir     string
	cp      *localcp.ControlPlane
	admin   client.WithWatch
	cs      *kubernetes.Clientset
	scheme  *runtime.Scheme
	manager string // the manager binary
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	logf.SetLogger(logr.Discard())
	root := envtest.Repo(t, "../..")
	dir := t.TempDir()
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(lockingv1alpha1.AddToScheme(scheme))
	env := &crenvtest.Environment{BinaryAssetsDirectory: filepath.Join(root, "bin"), Scheme: scheme}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cp := &localcp.ControlPlane{Env: env, Dir: dir, AdminConfig: cfg}
	if cp.AdminKubeconfig, err = cp.WriteKubeconfig("admin", env.KubeConfig); err != nil {
		t.Fatal(err)
	}
	admin, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{
		t: t, root: root, dir: dir, cp: cp, admin: admin, scheme: scheme,
		cs:      kubernetes.NewForConfigOrDie(cfg),
		manager: envtest.Build(t, root, dir, "./cmd/manager"),
	}
}

// run runs a command in the repository with the admin's kubeconfig.
func (c *cluster) run(name string, args ...string) string {
	c.t.Helper()
	cmd := exec.CommandContext(c.t.Context(), name, args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.cp.AdminKubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// stdout runs name with args like run, and returns only its standard
// output: what a caller captures with $(...), the messages on standard
// error left out.
func (c *cluster) stdout(name string, args ...string) string {
	c.t.Helper()
	cmd := exec.CommandContext(c.t.Context(), name, args...)
	cmd.Dir = c.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.cp.AdminKubeconfig)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func (c *cluster) kubectl() string { return filepath.Join(c.root, "bin", "kubectl") }

// serverSideApply applies a manifest with server-side apply; every object
// must be accepted.
func (c *cluster) serverSideApply(manifest string, extra ...string) string {
	c.t.Helper()
	cmd := exec.CommandContext(c.t.Context(), c.kubectl(), append([]string{"--kubeconfig", c.cp.AdminKubeconfig, "apply", "--server-side", "-f", "-"}, extra...)...)
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	if err != nil {
		c.t.Fatalf("kubectl apply --server-side: %v\n%s", err, out)
	}
	return string(out)
}

// routeWebhooksToLocalhost points the installed webhook configurations,
// which name the webhook Service, at the manager's port on localhost: what
// the Service and its endpoints do in a cluster.
func (c *cluster) routeWebhooksToLocalhost(port int) {
	c.t.Helper()
	ctx := c.t.Context()
	url := func(cc *admissionregistrationv1.WebhookClientConfig) {
		if cc.Service == nil {
			c.t.Fatalf("webhook clientConfig without a Service: %+v", cc)
		}
		if cc.Service.Name != "lockwarden-webhook-service" || cc.Service.Namespace != systemNamespace {
			c.t.Errorf("webhook Service %s/%s, want %s/lockwarden-webhook-service", cc.Service.Namespace, cc.Service.Name, systemNamespace)
		}
		cc.URL = ptr.To(fmt.Sprintf("https://localhost:%d%s", port, ptr.Deref(cc.Service.Path, "/")))
		cc.Service = nil
	}
	var mc admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.admin.Get(ctx, client.ObjectKey{Name: staticConfigs[0]}, &mc); err != nil {
		c.t.Fatal(err)
	}
	for i := range mc.Webhooks {
		url(&mc.Webhooks[i].ClientConfig)
	}
	if err := c.admin.Update(ctx, &mc); err != nil {
		c.t.Fatal(err)
	}
	var vc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.admin.Get(ctx, client.ObjectKey{Name: staticConfigs[1]}, &vc); err != nil {
		c.t.Fatal(err)
	}
	for i := range vc.Webhooks {
		url(&vc.Webhooks[i].ClientConfig)
	}
	if err := c.admin.Update(ctx, &vc); err != nil {
		c.t.Fatal(err)
	}
}

// tokenKubeconfig writes a kubeconfig authenticating with a fresh token of
// service account ns/name, as a pod of that account gets.
func (c *cluster) tokenKubeconfig(ns, name string) (string, string) {
	c.t.Helper()
	tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(c.t.Context(), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("token for service account %s/%s: %v", ns, name, err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: c.cp.AdminConfig.Host, CertificateAuthorityData: c.cp.AdminConfig.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["sa"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name, Namespace: ns}
	kc.CurrentContext = "sa"
	p := filepath.Join(c.dir, ns+"-"+name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		c.t.Fatal(err)
	}
	return p, tr.Status.Token
}

// managerProcess is the manager started as the installed Deployment runs it.
type managerProcess struct {
	*localcp.Manager
	metricsAddr string
}

// startManager runs the manager with the installed Deployment's arguments
// and environment, under its service account. Only what the cluster would
// provide differently is changed: listen addresses (free ports on
// 127.0.0.1, since other tests run at the same time), the webhook's DNS
// name (the API server calls localhost here) and the certificate directory
// (no kubelet mounts the Secret; the manager then reads the Secret itself).
func (c *cluster) startManager() *managerProcess {
	c.t.Helper()
	ctx := c.t.Context()
	var d appsv1.Deployment
	if err := c.admin.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: deploymentName}, &d); err != nil {
		c.t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != serviceAccount {
		c.t.Fatalf("the Deployment runs as %q, want %q", pod.ServiceAccountName, serviceAccount)
	}
	container := pod.Containers[0]
	if !slices.Equal(container.Command, []string{"/manager"}) {
		c.t.Errorf("the Deployment's command is %v, want [/manager] (the image's entrypoint)", container.Command)
	}
	free := func() int {
		p, err := localcp.FreePort()
		if err != nil {
			c.t.Fatal(err)
		}
		return p
	}
	webhookPort, probeAddr, metricsAddr := free(), "127.0.0.1:"+strconv.Itoa(free()), "127.0.0.1:"+strconv.Itoa(free())
	var args []string
	for _, a := range container.Args {
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--health-probe-bind-address":
			args = append(args, name+"="+probeAddr)
		case "--metrics-bind-address":
			args = append(args, name+"="+metricsAddr)
		case "--webhook-dns-name":
			args = append(args, name+"=localhost")
		case "--webhook-cert-dir", "--webhook-port":
		default:
			args = append(args, a)
		}
	}
	args = append(args, "--webhook-port="+strconv.Itoa(webhookPort))
	var env []string
	for _, e := range container.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env = append(env, e.Name+"="+d.Namespace)
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		default:
			c.t.Fatalf("the Deployment sets %s from %+v, which this test cannot provide", e.Name, e.ValueFrom)
		}
	}
	c.routeWebhooksToLocalhost(webhookPort)
	kubeconfig, _ := c.tokenKubeconfig(systemNamespace, serviceAccount)
	c.t.Logf("manager flags: %v, environment: %v", args, env)
	m, err := localcp.StartManager(localcp.ManagerOptions{
		Binary: c.manager, Kubeconfig: kubeconfig, Dir: c.dir, LogName: fmt.Sprintf("manager-%d.log", webhookPort),
		WebhookPort: webhookPort, Exact: true, ProbeAddr: probeAddr, Args: args, Env: env,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(m.Stop)
	if err := m.WaitReady(ctx, c.admin); err != nil {
		c.t.Fatal(err)
	}
	return &managerProcess{Manager: m, metricsAddr: metricsAddr}
}

// checkSecureMetrics: /metrics over HTTPS refuses an anonymous scraper and
// serves one whose service account is bound to the metrics-reader role.
func (c *cluster) checkSecureMetrics(m *managerProcess) {
	c.t.Helper()
	ctx := c.t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: "scraper"}}
	if err := c.admin.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-scraper-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "lockwarden-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: systemNamespace, Name: "scraper"}},
	}
	if err := c.admin.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	_, token := c.tokenKubeconfig(systemNamespace, "scraper")
	httpc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// The manager's metrics certificate is self-signed.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test of a self-signed server
	}}
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+m.metricsAddr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	var code int
	var body string
	err := wait.PollUntilContextTimeout(ctx, pollInterval, waitLimit, true, func(context.Context) (bool, error) {
		var err error
		code, body, err = get(token)
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		c.t.Fatalf("GET /metrics with the scraper's token: %d %.200s (%v)", code, body, err)
	}
	for _, want := range []string{"lockwarden_build_info{", "lockwarden_grant_wait_seconds_bucket", "lockwarden_admission_duration_seconds_bucket"} {
		if !strings.Contains(body, want) {
			c.t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _, err := get(""); err != nil || (code != http.StatusUnauthorized && code != http.StatusForbidden) {
		c.t.Errorf("GET /metrics without a token: %d (%v), want 401 or 403", code, err)
	}
}

// finalizeNamespace does what the namespace controller does for a deleted
// namespace: deletes what is left in it, then finalizes it.
func (c *cluster) finalizeNamespace(name string) {
	c.t.Helper()
	ctx := c.t.Context()
	opts := client.InNamespace(name)
	for _, obj := range []client.Object{
		&corev1.Secret{}, &corev1.ConfigMap{}, &corev1.ServiceAccount{}, &corev1.Service{},
		&rbacv1.Role{}, &rbacv1.RoleBinding{}, &lockingv1alpha1.LockGrant{},
	} {
		if err := c.admin.DeleteAllOf(ctx, obj, opts); err != nil && !apierrors.IsNotFound(err) {
			c.t.Fatalf("emptying namespace %s: %v", name, err)
		}
	}
	if err := c.cs.CoordinationV1().Leases(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		c.t.Fatal(err)
	}
	ns, err := c.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if ns.DeletionTimestamp == nil {
		c.t.Fatalf("namespace %s was not deleted", name)
	}
	ns.Spec.Finalizers = nil
	if _, err := c.cs.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, pollInterval, waitLimit, true, func(ctx context.Context) (bool, error) {
		_, err := c.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		c.t.Fatalf("namespace %s still there", name)
	}
}

// userClient returns a client authenticating as a new user name.
func (c *cluster) userClient(name string) client.WithWatch {
	c.t.Helper()
	u, err := c.cp.Env.AddUser(crenvtest.User{Name: name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	cl, err := client.NewWithWatch(rest.CopyConfig(u.Config()), client.Options{Scheme: c.scheme})
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}
