package chart

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

const haValues = "charts/lockwarden/ci/ha-certmanager-values.yaml"

func render(t *testing.T, root string, values ...string) []*unstructured.Unstructured {
	args := []string{"template", "lockwarden", "charts/lockwarden", "--namespace", "lockwarden-system"}
	for _, v := range values {
		args = append(args, "-f", v)
	}
	return envtest.Objects(t, envtest.Helm(t, root, args...))
}

func TestLint(t *testing.T) {
	root := envtest.Repo(t, "../..")
	envtest.Helm(t, root, "lint", "--strict", "charts/lockwarden")
	envtest.Helm(t, root, "lint", "--strict", "charts/lockwarden", "-f", haValues)
}

// webhooks returns every webhook configuration's webhooks, keyed by
// configuration kind and name, without what the chart and kustomize set
// differently on purpose (labels, annotations).
func webhooks(objs []*unstructured.Unstructured) map[string]any {
	out := map[string]any{}
	for _, o := range objs {
		if o.GetKind() == "ValidatingWebhookConfiguration" || o.GetKind() == "MutatingWebhookConfiguration" {
			out[o.GetKind()+"/"+o.GetName()] = o.Object["webhooks"]
		}
	}
	return out
}

// TestWebhooksMatchConfig: the chart registers exactly the webhooks
// config/default does (paths, rules, selectors, failure policies), pointing
// at the same Service in the release's namespace.
func TestWebhooksMatchConfig(t *testing.T) {
	root := envtest.Repo(t, "../..")
	want := webhooks(envtest.Objects(t, envtest.Kustomize(t, root, "config/default")))
	if len(want) == 0 {
		t.Fatal("config/default has no webhook configurations")
	}
	for _, values := range [][]string{nil, {haValues}} {
		got := webhooks(render(t, root, values...))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("values %v: the chart's webhook configurations differ from config/default's; run `make chart`\nchart:  %v\nconfig: %v", values, got, want)
		}
	}
}

// TestCRDsKeptOnUninstall: with the default values every CRD carries
// helm.sh/resource-policy: keep, so `helm uninstall` leaves every
// FenceCounter and the FenceIssuer; the CRDs are config/'s.
func TestCRDsKeptOnUninstall(t *testing.T) {
	root := envtest.Repo(t, "../..")
	config := envtest.Objects(t, envtest.Kustomize(t, root, "config/crd"))
	objs := render(t, root)
	for _, c := range config {
		got := envtest.Find(t, objs, "CustomResourceDefinition", c.GetName())
		if got.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s: annotations %v, want helm.sh/resource-policy: keep", c.GetName(), got.GetAnnotations())
		}
		if !reflect.DeepEqual(got.Object["spec"], c.Object["spec"]) {
			t.Errorf("CRD %s: the chart's spec differs from config/crd; run `make chart`", c.GetName())
		}
	}
	off := envtest.Objects(t, envtest.Helm(t, root, "template", "lockwarden", "charts/lockwarden", "--set", "crds.keep=false"))
	for _, o := range off {
		if o.GetKind() == "CustomResourceDefinition" && o.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
			t.Errorf("crds.keep=false: CRD %s still kept", o.GetName())
		}
	}
}

func managerArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	d := envtest.Find(t, objs, "Deployment", "lockwarden-controller-manager")
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	return args
}

// TestManagerFlags: the chart's manager runs with config/default's flags
// (plus the leader election timings and retention it makes settable), and
// with cert-manager it leaves the certificate to cert-manager.
func TestManagerFlags(t *testing.T) {
	root := envtest.Repo(t, "../..")
	cfg := managerArgs(t, envtest.Objects(t, envtest.Kustomize(t, root, "config/default")))
	chart := managerArgs(t, render(t, root))
	for _, a := range cfg {
		if !slices.Contains(chart, a) {
			t.Errorf("config/default runs the manager with %s; the chart does not (chart: %v)", a, chart)
		}
	}
	ha := render(t, root, haValues)
	for _, a := range managerArgs(t, ha) {
		if strings.HasPrefix(a, "--webhook-cert-secret") {
			t.Errorf("with cert-manager the manager must not rotate its own certificate: %s", a)
		}
	}
	for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
		for _, o := range ha {
			if o.GetKind() == kind && o.GetAnnotations()["cert-manager.io/inject-ca-from"] != "lockwarden-system/lockwarden-webhook-server-cert" {
				t.Errorf("%s %s: annotations %v, want cert-manager.io/inject-ca-from", kind, o.GetName(), o.GetAnnotations())
			}
		}
	}
	envtest.Find(t, ha, "Certificate", "lockwarden-webhook-server-cert")
	envtest.Find(t, ha, "ServiceMonitor", "lockwarden-controller-manager")
	envtest.Find(t, ha, "PrometheusRule", "lockwarden-alerts")
	envtest.Find(t, ha, "NetworkPolicy", "lockwarden-controller-manager")
	pdb := envtest.Find(t, ha, "PodDisruptionBudget", "lockwarden-controller-manager")
	if v, _, _ := num(pdb.Object, "spec", "minAvailable"); v != 2 {
		t.Errorf("PDB minAvailable = %d, want 2 from the HA values", v)
	}
}

// TestProductionDefaults: non-root numeric user, metrics over HTTPS with the
// metrics-reader role, two replicas behind a PDB, the manager's Secret
// rights in a Role of its namespace.
func TestProductionDefaults(t *testing.T) {
	root := envtest.Repo(t, "../..")
	objs := render(t, root)
	d := envtest.Find(t, objs, "Deployment", "lockwarden-controller-manager")
	if uid, _, _ := num(d.Object, "spec", "template", "spec", "securityContext", "runAsUser"); uid != 65532 {
		t.Errorf("runAsUser = %d, want 65532", uid)
	}
	if r, _, _ := num(d.Object, "spec", "replicas"); r != 2 {
		t.Errorf("replicas = %d, want 2", r)
	}
	args := managerArgs(t, objs)
	if !slices.Contains(args, "--metrics-bind-address=:8443") || slices.Contains(args, "--metrics-secure=false") {
		t.Errorf("metrics must be served over HTTPS on :8443 by default: %v", args)
	}
	envtest.Find(t, objs, "ClusterRole", "lockwarden-metrics-reader")
	envtest.Find(t, objs, "PodDisruptionBudget", "lockwarden-controller-manager")
	role := envtest.Find(t, objs, "Role", "lockwarden-manager-role")
	if role.GetNamespace() != "lockwarden-system" {
		t.Errorf("manager Role in namespace %q", role.GetNamespace())
	}
	cr := envtest.Find(t, objs, "ClusterRole", "lockwarden-manager-role")
	rules, _, _ := unstructured.NestedSlice(cr.Object, "rules")
	for _, r := range rules {
		res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		if slices.Contains(res, "secrets") || slices.Contains(res, "configmaps") {
			t.Errorf("the manager's ClusterRole grants %v cluster-wide", res)
		}
	}
}

// num reads an integer field of a decoded manifest (JSON numbers decode as
// float64).
func num(obj map[string]any, fields ...string) (int64, bool, error) {
	v, ok, err := unstructured.NestedFieldNoCopy(obj, fields...)
	switch n := v.(type) {
	case int64:
		return n, ok, err
	case float64:
		return int64(n), ok, err
	}
	return 0, ok, err
}

// TestFailClosedWebhooksSkipTheirNamespace: every webhook that fails closed
// (failurePolicy Fail) and intercepts more than lockwarden's own kinds skips
// kube-system and the namespace the manager runs in, whatever the release's
// namespace, and is narrowed to lockwarden's objects by an objectSelector or
// matchConditions: while no replica answers it holds up only what lockwarden
// guards, and the manager's own Pods are always scheduled.
func TestFailClosedWebhooksSkipTheirNamespace(t *testing.T) {
	root := envtest.Repo(t, "../..")
	for ns, objs := range map[string][]*unstructured.Unstructured{
		"lockwarden-system": envtest.Objects(t, envtest.Kustomize(t, root, "config/default")),
		"locks":             envtest.Objects(t, envtest.Helm(t, root, "template", "lockwarden", "charts/lockwarden", "--namespace", "locks")),
	} {
		for _, o := range objs {
			if o.GetKind() != "ValidatingWebhookConfiguration" && o.GetKind() != "MutatingWebhookConfiguration" {
				continue
			}
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			for _, h := range hooks {
				h := h.(map[string]any)
				if policy, _, _ := unstructured.NestedString(h, "failurePolicy"); policy != "Fail" || ownKindsOnly(h) {
					continue
				}
				name := h["name"]
				skipped := map[string]bool{}
				exprs, _, _ := unstructured.NestedSlice(h, "namespaceSelector", "matchExpressions")
				for _, e := range exprs {
					e := e.(map[string]any)
					if e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn" {
						values, _, _ := unstructured.NestedStringSlice(e, "values")
						for _, v := range values {
							skipped[v] = true
						}
					}
				}
				if !skipped["kube-system"] || !skipped[ns] {
					t.Errorf("namespace %s: webhook %s fails closed and does not skip kube-system and %s: %v", ns, name, ns, h["namespaceSelector"])
				}
				_, selected, _ := unstructured.NestedMap(h, "objectSelector")
				_, narrowed, _ := unstructured.NestedSlice(h, "matchConditions")
				if !selected && !narrowed {
					t.Errorf("namespace %s: webhook %s fails closed for every object of its kinds", ns, name)
				}
			}
		}
	}
}

// ownKindsOnly reports whether every rule of the webhook h is for
// lockwarden's own API group.
func ownKindsOnly(h map[string]any) bool {
	rules, _, _ := unstructured.NestedSlice(h, "rules")
	for _, r := range rules {
		groups, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
		if !slices.Equal(groups, []string{"locking.lockwarden.io"}) {
			return false
		}
	}
	return true
}

// TestGatedPodPolicyCoversWhatTheWebhookSkips: the namespaces where the
// lock-gated Pod webhook does not serve (kube-system and the manager's, the
// release's namespace in the chart) are exactly those where the
// ValidatingAdmissionPolicy refuses a Pod that names a lock, so that no such
// Pod, in any namespace, starts without its lock.
func TestGatedPodPolicyCoversWhatTheWebhookSkips(t *testing.T) {
	root := envtest.Repo(t, "../..")
	for ns, objs := range map[string][]*unstructured.Unstructured{
		"lockwarden-system": envtest.Objects(t, envtest.Kustomize(t, root, "config/default")),
		"locks":             envtest.Objects(t, envtest.Helm(t, root, "template", "lockwarden", "charts/lockwarden", "--namespace", "locks")),
	} {
		var skipped, refused []string
		for _, o := range objs {
			switch o.GetKind() {
			case "MutatingWebhookConfiguration":
				hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
				for _, h := range hooks {
					h := h.(map[string]any)
					if h["name"] == "mgatedpod.locking.lockwarden.io" {
						skipped = selectorValues(h, "NotIn", "namespaceSelector")
					}
				}
			case "ValidatingAdmissionPolicy":
				if o.GetName() == "lockwarden-gated-pod-unserved-namespace" {
					refused = selectorValues(o.Object, "In", "spec", "matchConstraints", "namespaceSelector")
				}
			}
		}
		slices.Sort(skipped)
		slices.Sort(refused)
		want := []string{"kube-system", ns}
		slices.Sort(want)
		if !slices.Equal(skipped, want) {
			t.Errorf("namespace %s: the gated-Pod webhook skips %v, want %v", ns, skipped, want)
		}
		if !slices.Equal(refused, want) {
			t.Errorf("namespace %s: the gated-Pod policy refuses lock-naming Pods in %v, want %v", ns, refused, want)
		}
	}
}

// selectorValues returns the values of the kubernetes.io/metadata.name
// expressions with operator op in the label selector at fields of obj.
func selectorValues(obj map[string]any, op string, fields ...string) []string {
	var out []string
	exprs, _, _ := unstructured.NestedSlice(obj, append(fields, "matchExpressions")...)
	for _, e := range exprs {
		e := e.(map[string]any)
		if e["key"] == "kubernetes.io/metadata.name" && e["operator"] == op {
			values, _, _ := unstructured.NestedStringSlice(e, "values")
			out = append(out, values...)
		}
	}
	return out
}

// TestGuardReads: the chart passes guardReads to the manager, and refuses
// to render a value the manager would refuse at start (a crashloop after
// the install instead of an error at it).
func TestGuardReads(t *testing.T) {
	root := envtest.Repo(t, "../..")
	if args := managerArgs(t, render(t, root)); !slices.Contains(args, "--guard-reads=cached") {
		t.Errorf("by default the manager runs with %v, want --guard-reads=cached", args)
	}
	direct := envtest.Objects(t, envtest.Helm(t, root, "template", "lockwarden", "charts/lockwarden", "--set", "guardReads=direct"))
	if args := managerArgs(t, direct); !slices.Contains(args, "--guard-reads=direct") {
		t.Errorf("with guardReads=direct the manager runs with %v", args)
	}
	for _, bad := range []string{"guardReads=Direct", "guardReads=bogus", "guardReads="} {
		cmd := exec.CommandContext(t.Context(), filepath.Join(root, "bin", "helm"), "template", "lockwarden", "charts/lockwarden", "--set", bad)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), `guardReads must be "cached" or "direct"`) {
			t.Errorf("helm template --set %s: %v, want it refused:\n%s", bad, err, out)
		}
	}
}
