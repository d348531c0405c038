// Package cluster is the real-node suite: lockwarden installed as users
// install it, on the one-node cluster of `make cluster` (etcd,
// kube-apiserver, kube-controller-manager with its garbage collector and
// namespace controller, kube-scheduler, containerd, the kubelet and
// kube-proxy; hack/cluster/cluster.sh), with the manager as Pods behind its
// Service. `make test-cluster` runs it; without -cluster-dir (as in `make
// test`) every test is skipped. It covers, in this order:
//
//   - install: `kubectl apply --server-side -f dist/install.yaml` and `helm
//     install --wait`, five times each from scratch, Ready every time, the
//     webhooks answering through the Service; the README's uninstall after
//     each;
//   - outage: with no manager replica running, unguarded Pods are scheduled,
//     unguarded workloads scale and `kubectl drain` evicts unguarded Pods,
//     while guarded objects stay unwritable; every manager Pod deleted, the
//     manager comes back by itself;
//   - the paused-holder story with the workers as Pods: worker A frozen
//     through its container's cgroup freezer past its lease, worker B
//     granted the next fence, and A's late write refused STALE_OWNER;
//   - a lock-gated Job of parallelism 3 whose Pods write one guarded
//     ConfigMap under the fence the manager gave each, the kubelet and
//     containerd restarted while one holds and two wait: they run one at
//     a time, every grant ends Released, every write accepted names the
//     grant of the Pod running then, and the fences strictly increase;
//   - a gated Job's holding Pod frozen past its lease: not ready, its
//     grant expires, the next Pod is granted and writes, the frozen Pod is
//     marked LockLost and deleted, and its late write is refused
//     STALE_OWNER; gated Pods deleted while waiting (the request is
//     withdrawn without a fence) and while holding (released, the next
//     starts);
//   - with LOCKWARDEN_CLUSTER_FIGURES=1, the gate's latency: created ->
//     running with and without it, and handoffs traced step by step;
//   - restarts: the kubelet and containerd killed and started again, a
//     manager container killed, while holders and waiters run: grants keep
//     flowing, never two holders, no fence reset;
//   - namespaces: deleting one with live grants and guarded objects
//     completes; a guarded object owned by an unguarded one is never deleted
//     by the garbage collector without a fence;
//   - fences: `helm uninstall` keeps every FenceCounter and a reinstall
//     continues them; the webhook Secret deleted and the manager restarted
//     recovers;
//   - upgrade: the previous release (its own chart and image) upgraded to
//     this one as the README says, under live holders and waiters, with no
//     grant lost and fences continuing.
//
// Each test prints its timings (install to Ready, manager Pods deleted to
// Ready, the longest stall of the grant traffic) and the suite its wall
// time. The suite needs root on the machine that runs the cluster: it
// freezes a worker's cgroup and restarts the node's daemons.
package cluster
