package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// earlierLife creates ConfigMap name in ns, labeled app=policy, with the
// record of a write a GuardPolicy named policy accepted in an earlier life
// of the cluster: fence under resource res, its proof signed with the
// issuer's key, as if the FenceCounters were lost since (CRDs reinstalled).
// No webhook sees the create: the policy does not exist yet.
func earlierLife(t *testing.T, ns, name, res, policy string, fence int64) {
	t.Helper()
	issuerEpoch(t)
	params, err := (&issuer.Keyring{Reader: admin, Namespace: managerNamespace}).Params(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rec := fencing.Record{
		Namespace: ns, Resource: res, Owner: "system:serviceaccount:billing:earlier", Grant: "earlier-life", LeaseID: "uid-earlier-life",
		Fence: fence, BackendRevision: "1", Policy: policy, PolicyGeneration: 1, IssuerEpoch: fencing.EpochOf(fence), TTLSeconds: 60, KeyID: params.KeyID,
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": policy}, Annotations: map[string]string{
			lockingv1alpha1.AcceptedGrantAnnotation: ns + "/" + rec.Grant,
			lockingv1alpha1.AcceptedFenceAnnotation: fencing.FormatFence(fence),
			lockingv1alpha1.AcceptedProofAnnotation: string(fencing.Sign(rec, params.Key)),
		}},
		Data: map[string]string{"result": "earlier life"},
	}
	if err := admin.Create(t.Context(), cm); err != nil {
		t.Fatal(err)
	}
}

// enforced waits until the policy's webhook refuses an unfenced write to
// the object (the API server loads a new webhook configuration a moment
// after it is written).
func enforced(t *testing.T, ns, name string) {
	t.Helper()
	waitUntil(t, "the policy's webhook judges "+name, func() (bool, error) {
		return reason(writeCM(t, as(t, "rec-probe"), ns, name, "probe", nil, nil)) == "NO_FENCE", nil
	})
}

var recoveryKubeconfig = sync.OnceValues(func() (string, error) {
	u, err := env.Env.AddUser(envtest.User{Name: "recovery-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "lockwarden-recovery-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
})

// nextEpoch runs hack/next-epoch.sh against the cluster as an
// administrator, with bin/kubectl, and returns its stdout, stderr and
// exit status.
func nextEpoch(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	kc, err := recoveryKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "bash", append([]string{filepath.Join(env.Root, "hack", "next-epoch.sh")}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kc, "KUBECTL="+filepath.Join(env.Root, "bin", "kubectl"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return strings.TrimSpace(stdout.String()), stderr.String(), exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), "error:") {
		t.Fatalf("next-epoch.sh passed kubectl an invalid request: %s", stderr.String())
	}
	return strings.TrimSpace(stdout.String()), stderr.String(), 0
}

// After a reinstall the issuer is below an epoch that an object under a
// GuardPolicy recorded (no guard label). The new holder's write is refused
// FENCE_REGRESSION saying which epoch to set, the FenceIssuer gets an
// Event that points to the object, and hack/next-epoch.sh counts the
// object's fence.
func TestRecoveryReachesPolicyGuardedObjects(t *testing.T) {
	ns := namespace(t)
	const name = "ledger-7"
	policy := "recovery-" + ns
	res := "settlement/" + ns + "/" + name
	recorded := int64(1000)<<fencing.EpochBits | 1
	earlierLife(t, ns, name, res, policy, recorded)
	newPolicy(t, policy, ns, lockingv1alpha1.ModeEnforce, "rec-a")
	enforced(t, ns, name)

	a := as(t, "rec-a")
	g := policyAcquire(t, a, ns, res, policy)
	err := writeCM(t, a, ns, name, "new holder", map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}, nil)
	wantReason(t, "the new holder's write", err, "FENCE_REGRESSION")
	if !strings.Contains(err.Error(), "spec.epoch to 1001 or more") {
		t.Fatalf("the refusal %q does not say which epoch to set", err)
	}
	if data, fence := readCM(t, ns, name); data != "earlier life" || fence != fencing.FormatFence(recorded) {
		t.Fatalf("object = %q at fence %s after the refusal", data, fence)
	}
	waitEvent(t, metav1.NamespaceDefault, "FenceIssuer", lockingv1alpha1.DefaultFenceIssuerName, "FenceRegression", "ConfigMap "+ns+"/"+name)

	out, stderr, code := nextEpoch(t)
	if code != 0 || out != "1001" {
		t.Fatalf("next-epoch.sh = %q, exit %d (stderr: %s); want 1001, from the object under the policy", out, code, stderr)
	}
}

// An object that recorded a fence of the last epoch, 8388607, is wedged:
// no epoch can be raised above it. hack/next-epoch.sh says so instead of
// printing an epoch the CRD refuses; an administrator (and nobody else)
// retires the object with an override and a delete, without ever lowering
// its recorded fence.
func TestWedgedObjectOverride(t *testing.T) {
	ns := namespace(t)
	const name = "ledger-last-epoch"
	policy := "wedged-" + ns
	res := "settlement/" + ns + "/" + name
	recorded := int64(fencing.MaxEpoch)<<fencing.EpochBits | 1
	earlierLife(t, ns, name, res, policy, recorded)
	newPolicy(t, policy, ns, lockingv1alpha1.ModeEnforce, "wedge-a")
	enforced(t, ns, name)

	a, b := as(t, "wedge-a"), as(t, "wedge-b")
	g := policyAcquire(t, a, ns, res, policy)
	err := writeCM(t, a, ns, name, "new holder", map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}, nil)
	wantReason(t, "the holder's write", err, "FENCE_REGRESSION")
	if !strings.Contains(err.Error(), "An object wedged in the last epoch") {
		t.Fatalf("the refusal %q does not point to the way out", err)
	}
	out, stderr, code := nextEpoch(t)
	if code != 2 || out != "" || !strings.Contains(stderr, "configmaps "+ns+"/"+name) || !strings.Contains(stderr, "docs/runbook.md") {
		t.Fatalf("next-epoch.sh = %q, exit %d, stderr %q; want exit 2 naming the object and the runbook, and no epoch", out, code, stderr)
	}

	override := map[string]string{lockingv1alpha1.OverrideAnnotation: "restored from a cluster at the last epoch; ticket 4711"}
	wantReason(t, "an override by a workload", writeCM(t, b, ns, name, "b", override, nil), "NOT_OWNER")
	wantReason(t, "an override without a reason", writeCM(t, &actor{name: "admin", c: admin}, ns, name, "x", map[string]string{lockingv1alpha1.OverrideAnnotation: " "}, nil), "OVERRIDE_REFUSED")
	if err := writeCM(t, &actor{name: "admin", c: admin}, ns, name, "retired", override, nil); err != nil {
		t.Fatalf("the administrator's override: %v", err)
	}
	cm := configMap(t, ns, name)
	if ann := cm.Annotations; ann[lockingv1alpha1.AcceptedFenceAnnotation] != fencing.FormatFence(recorded) ||
		ann[lockingv1alpha1.AcceptedIntentAnnotation] != fencing.IntentOverride || ann[lockingv1alpha1.OverrideAnnotation] != "" {
		t.Fatalf("annotations after the override: %v; want the fence kept, intent %q, the override consumed", ann, fencing.IntentOverride)
	}
	waitEvent(t, ns, "ConfigMap", name, lockingv1alpha1.EventReasonGuardOverridden, "ticket 4711")
	waitEvent(t, metav1.NamespaceDefault, "FenceIssuer", lockingv1alpha1.DefaultFenceIssuerName, lockingv1alpha1.EventReasonGuardOverridden, "ConfigMap "+ns+"/"+name)
	if out, stderr, code := nextEpoch(t); code != 0 || !strings.Contains(stderr, "an administrator overrode its guard") {
		t.Fatalf("next-epoch.sh after the override = %q, exit %d, stderr %q; want an epoch, the retired object not counted", out, code, stderr)
	}

	// A holder still cannot write it; a workload cannot delete it; the
	// administrator deletes it under the override's version.
	wantReason(t, "the holder's write after the override", writeCM(t, a, ns, name, "x", map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.FenceAnnotation: fenceOf(g), lockingv1alpha1.ProofAnnotation: g.Status.Proof,
	}, nil), "FENCE_REGRESSION")
	wantReason(t, "a workload's delete", deleteAt(t, b, ns, name, cm.ResourceVersion), "NOT_OWNER")
	wantReason(t, "the administrator's delete without the override's version", deleteAt(t, &actor{name: "admin", c: admin}, ns, name, ""), "NO_FENCE")
	if err := deleteAt(t, &actor{name: "admin", c: admin}, ns, name, cm.ResourceVersion); err != nil {
		t.Fatalf("the administrator's delete: %v", err)
	}
	if configMap(t, ns, name) != nil {
		t.Fatal("the object was not deleted")
	}
}
