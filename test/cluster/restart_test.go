package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// containerCgroup returns the directory of the cgroup of container name of
// pod in hierarchy sub ("freezer", "pids", ...; "" under cgroup v2), below
// the cluster's cgroup root.
func containerCgroup(t *testing.T, pod *corev1.Pod, name, sub string) string {
	t.Helper()
	var id string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == name {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if id == "" {
		t.Fatalf("Pod %s/%s has no running container %s", pod.Namespace, pod.Name, name)
	}
	base := filepath.Join("/sys/fs/cgroup", env.vars["CGROUP_ROOT"])
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil { // cgroup v1
		base = filepath.Join("/sys/fs/cgroup", sub, env.vars["CGROUP_ROOT"])
	}
	podDir := "pod" + string(pod.UID)
	var found string
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == id && strings.Contains(p, podDir) {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil || found == "" {
		t.Fatalf("no cgroup of container %s (%s) of Pod %s/%s under %s: %v", name, id, pod.Namespace, pod.Name, base, err)
	}
	return found
}

// kill sends sig to every process of container name of pod.
func kill(t *testing.T, pod *corev1.Pod, name string, sig syscall.Signal) {
	t.Helper()
	procs, err := os.ReadFile(filepath.Join(containerCgroup(t, pod, name, "pids"), "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(procs)) {
		pid, _ := strconv.Atoi(f)
		if err := syscall.Kill(pid, sig); err != nil {
			t.Errorf("signalling process %d of %s/%s: %v", pid, pod.Name, name, err)
		}
	}
}

// leader returns the manager Pod that holds the leader election Lease.
func leader(t *testing.T) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, "a manager replica leads", time.Minute, func(ctx context.Context) (bool, error) {
		lease := &coordinationv1.Lease{}
		if err := env.c.Get(ctx, types.NamespacedName{Namespace: releaseNamespace, Name: "lockwarden.locking.lockwarden.io"}, lease); err != nil {
			return false, err
		}
		if lease.Spec.HolderIdentity == nil {
			return false, errors.New("no holder")
		}
		name, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
		pod = &corev1.Pod{}
		err := env.c.Get(ctx, types.NamespacedName{Namespace: releaseNamespace, Name: name}, pod)
		return err == nil && pod.DeletionTimestamp == nil, err
	})
	return pod
}

// testRestarts kills the kubelet and containerd and starts them again, then
// kills the leading manager's container, while holders and waiters run.
func testRestarts(t *testing.T) {
	ensureRelease(t)
	ns := namespace(t, "restarts")
	since := time.Now()
	tr := startTraffic(t, ns, 3, 2)
	tr.flowing(t, 10, time.Minute)

	start := time.Now()
	must(t)(run(t.Context(), filepath.Join(env.root, "hack", "cluster", "cluster.sh"), "restart-node"))
	record(t, "kubelet and containerd killed -> node Ready", time.Since(start), 0)
	tr.flowing(t, 10, time.Minute)

	pod := leader(t)
	restarts := pod.Status.ContainerStatuses[0].RestartCount
	start = time.Now()
	kill(t, pod, "manager", syscall.SIGKILL)
	eventually(t, "the killed manager container is running and Ready again", 2*time.Minute, func(ctx context.Context) (bool, error) {
		if err := env.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err
		}
		s := pod.Status.ContainerStatuses[0]
		return s.RestartCount > restarts && s.Ready, fmt.Errorf("restarts %d, ready %v", s.RestartCount, s.Ready)
	})
	record(t, "manager container killed -> Ready", time.Since(start), recoverTarget)
	served(t)
	tr.flowing(t, 10, time.Minute)
	record(t, "longest grant stall: restarts", tr.stop(t, since), 0)
}
