package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// workerImage is the image of the story's workers: the demo's own worker
// (test/cmd/lockwarden-demo, subcommand worker), which reports each step as
// a JSON line on its stdout.
const workerImage = "lockwarden.test/worker:latest"

// workerLoaded: loadWorkerImage imported the worker's image in this run.
var workerLoaded bool

// loadWorkerImage builds the demo statically, writes its image (one layer,
// /lockwarden-demo and a writable /tmp, non-root) with go-containerregistry and imports it into
// the cluster's containerd.
func loadWorkerImage(t *testing.T) {
	t.Helper()
	// Once per run: every step after the first finds it in containerd.
	if workerLoaded {
		return
	}
	defer func() { workerLoaded = !t.Failed() }()
	dir := t.TempDir()
	bin := filepath.Join(dir, "lockwarden-demo")
	build := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", bin, "./cmd/lockwarden-demo")
	build.Dir = filepath.Join(env.root, "test")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the worker: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	// A writable /tmp: the demo's packages create directories there.
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Mode: 0o1777, Typeflag: tar.TypeDir}); err != nil {
		t.Fatal(err)
	}
	if err := tw.WriteHeader(&tar.Header{Name: "lockwarden-demo", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), l)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.User = "65532:65532"
	cf.Config.Entrypoint = []string{"/lockwarden-demo"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(workerImage)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "worker.tar")
	if err := tarball.WriteToFile(out, tag, img); err != nil {
		t.Fatal(err)
	}
	must(t)(run(t.Context(), "ctr", "--address", env.vars["CONTAINERD_ADDRESS"], "-n", "k8s.io", "images", "import", out))
}

// workerEvent is one line of a worker's report (the demo's Event).
type workerEvent struct {
	Event  string `json:"event"`
	Fence  int64  `json:"fence"`
	Reason string `json:"reason"`
	Detail string `json:"detail"`
}

// startWorker runs worker actor (service account sa) as a Pod and returns
// its report, line by line.
func startWorker(t *testing.T, ns, actor, sa string, args ...string) (*corev1.Pod, <-chan workerEvent) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker-" + strings.ToLower(actor)},
		Spec: corev1.PodSpec{
			ServiceAccountName:            sa,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "worker", Image: workerImage, ImagePullPolicy: corev1.PullNever,
				Args: append([]string{"worker", "--actor", actor, "--kubeconfig", "", "--namespace", ns,
					"--resource", "invoice-batch/2026-07-19", "--configmap", "settlement-2026-07-19", "--ttl", "10"}, args...),
			}},
		},
	}
	if err := env.c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	eventually(t, "worker "+actor+" runs", time.Minute, func(ctx context.Context) (bool, error) {
		if err := env.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err
		}
		return pod.Status.Phase != corev1.PodPending, fmt.Errorf("phase %s", pod.Status.Phase)
	})
	return pod, followWorker(t, pod, actor)
}

// await returns the worker's next report of one of kinds.
func await(t *testing.T, actor string, events <-chan workerEvent, kinds ...string) workerEvent {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("worker %s ended before reporting %v", actor, kinds)
			}
			if ev.Event == "failed" {
				t.Fatalf("worker %s failed: %s", actor, ev.Detail)
			}
			for _, k := range kinds {
				if ev.Event == k {
					return ev
				}
			}
		case <-timeout:
			t.Fatalf("worker %s reported none of %v", actor, kinds)
		}
	}
}

// freeze stops (or, with frozen false, resumes) every process of the
// worker's container through its cgroup's freezer, as a long GC pause or a
// stalled VM would.
func freeze(t *testing.T, pod *corev1.Pod, frozen bool) {
	t.Helper()
	dir := containerCgroup(t, pod, "worker", "freezer")
	file, value, want := filepath.Join(dir, "freezer.state"), "THAWED", "THAWED"
	if frozen {
		value, want = "FROZEN", "FROZEN"
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err == nil { // cgroup v2
		file, value, want = filepath.Join(dir, "cgroup.freeze"), "0", "0"
		if frozen {
			value, want = "1", "1"
		}
	}
	if err := os.WriteFile(file, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "worker's cgroup is "+want, 30*time.Second, func(context.Context) (bool, error) {
		b, err := os.ReadFile(file)
		return strings.TrimSpace(string(b)) == want, err
	})
}

// testPausedHolder plays the paused-holder story with the workers as Pods
// of two service accounts: worker A holds fence 1, writes and is frozen
// mid-work past its lease; worker B is granted fence 2, writes and
// releases; A, resumed, writes with fence 1 and is refused STALE_OWNER, so
// the ConfigMap keeps B's result.
func testPausedHolder(t *testing.T) {
	ensureRelease(t)
	loadWorkerImage(t)
	ns := namespace(t, "billing")
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settlement-worker"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"}},
			{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"fencecounters"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settlement-worker"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
	}
	objs := []client.Object{role}
	for _, sa := range []string{"worker-a", "worker-b"} {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa})
	}
	for _, o := range append(objs, binding) {
		if err := env.c.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}

	a, aEvents := startWorker(t, ns, "A", "worker-a", "--result", "A: first half of the batch", "--result", "A: stale total", "--work", "8s")
	t.Cleanup(func() { freezeQuietly(a) })
	held := await(t, "A", aEvents, "held")
	if w := await(t, "A", aEvents, "write-accepted", "write-rejected"); w.Event != "write-accepted" {
		t.Fatalf("worker A's first write with fence %d was refused: %s", held.Fence, w.Detail)
	}
	if err := env.c.Get(t.Context(), client.ObjectKeyFromObject(a), a); err != nil {
		t.Fatal(err)
	}
	freeze(t, a, true)
	frozenAt := time.Now()

	var grant *lockingv1alpha1.LockGrant
	eventually(t, "worker A's grant expires while A is frozen", time.Minute, func(ctx context.Context) (bool, error) {
		var list lockingv1alpha1.LockGrantList
		if err := env.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].Status.FenceToken == held.Fence {
				grant = &list.Items[i]
			}
		}
		return grant != nil && grant.Status.Phase == lockingv1alpha1.PhaseExpired, nil
	})
	_, bEvents := startWorker(t, ns, "B", "worker-b", "--result", "B: correct total", "--release")
	bHeld := await(t, "B", bEvents, "held")
	if bHeld.Fence <= held.Fence {
		t.Fatalf("worker B holds fence %d, not above A's %d", bHeld.Fence, held.Fence)
	}
	if w := await(t, "B", bEvents, "write-accepted", "write-rejected"); w.Event != "write-accepted" {
		t.Fatalf("worker B's write with fence %d, the current holder's, was refused: %s", bHeld.Fence, w.Detail)
	}
	await(t, "B", bEvents, "released")

	freeze(t, a, false)
	t.Logf("worker A was frozen for %.1fs", time.Since(frozenAt).Seconds())
	late := await(t, "A", aEvents, "write-accepted", "write-rejected")
	if late.Event != "write-rejected" || late.Reason != "STALE_OWNER" {
		t.Fatalf("worker A's late write with fence %d: %s %s %s, want it refused STALE_OWNER", late.Fence, late.Event, late.Reason, late.Detail)
	}
	cm := &corev1.ConfigMap{}
	if err := env.c.Get(t.Context(), k8stypes.NamespacedName{Namespace: ns, Name: "settlement-2026-07-19"}, cm); err != nil {
		t.Fatal(err)
	}
	if got := cm.Data["result"]; got != "B: correct total" {
		t.Errorf("the ConfigMap holds %q, want B's result", got)
	}
}

// freezeQuietly thaws pod's worker, if it is still frozen, at the end of
// the test.
func freezeQuietly(pod *corev1.Pod) {
	base := filepath.Join("/sys/fs/cgroup/freezer", env.vars["CGROUP_ROOT"])
	_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "freezer.state" && strings.Contains(p, "pod"+string(pod.UID)) {
			_ = os.WriteFile(p, []byte("THAWED"), 0o644)
		}
		return nil
	})
}
