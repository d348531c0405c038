#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, for the end-to-end
# suite that runs lockwarden as users run it (`make test-cluster`): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd with
# runc, the kubelet and kube-proxy, every one built from source into bin/
# (hack/build-tools.sh node) or installed from Debian, with no Docker and no
# registry. See docs/real-node.md.
#
#   hack/cluster/cluster.sh up      # prints the KUBECONFIG to use
#   hack/cluster/cluster.sh down    # removes everything up made
#   hack/cluster/cluster.sh check   # says why the cluster cannot run here
#   hack/cluster/cluster.sh restart-node  # kills the kubelet and containerd, starts them again
#   hack/cluster/cluster.sh load TARBALL...  # imports images into the cluster's containerd
#
# Everything lives in CLUSTER_DIR (default .tmp/cluster): certificates,
# configuration, etcd's and containerd's data, the kubelet's root, logs and
# the kubeconfig. The components run in a network namespace of their own
# (lw-<hash of CLUSTER_DIR>), so their ports, routes, bridge and iptables
# rules never touch the host's and two clusters with different directories
# never collide; the host reaches the API server through one forwarded
# local port. Pods' cgroups live under /lw-<hash> in every hierarchy.
# `down` stops every process of the cluster (those in its namespace or its
# cgroups, and those it started), unmounts what is mounted under
# CLUSTER_DIR, removes the cgroups, the namespace with its rules, the
# kubelet's log links, and restores the kernel settings the kubelet changed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${LOCALBIN:-$root/bin}"
dir="$(realpath -m "${CLUSTER_DIR:-$root/.tmp/cluster}")"
id="$(printf %s "$dir" | sha1sum | cut -c1-8)"
netns="lw-$id"
cgroup_root="lw-$id"

# The cluster's addresses, inside its namespace only.
node=lwnode
node_ip=10.250.0.1   # one end of a veth pair whose other end stays inside too
node_peer=10.250.0.2 # the default route: packets for anywhere else die here
pod_cidr=10.88.0.0/16
service_cidr=10.96.0.0/16
api_service_ip=10.96.0.1
pause_image=registry.k8s.io/pause:3.10-lockwarden

# The host settings the kubelet changes (with protectKernelDefaults off, as
# by default), restored by down.
kernel_settings=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
packages=(containerd runc containernetworking-plugins iptables conntrack)

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() {
	log "cluster: $*"
	exit 1
}
in_ns() { nsenter --net="/run/netns/$netns" -- "$@"; }
kubectl() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

# check says why the cluster cannot run here, and fails, or says nothing.
check() {
	local why=()
	[[ "$(uname -s)" == Linux ]] || why+=("it needs Linux")
	[[ "$(id -u)" == 0 ]] || why+=("it needs root (network namespaces, cgroups, mounts, containerd)")
	command -v nsenter >/dev/null && command -v ip >/dev/null || why+=("it needs nsenter and ip (util-linux, iproute2)")
	command -v apt-get >/dev/null || missing_packages >/dev/null || why+=("it installs ${packages[*]} with apt-get (Debian)")
	[[ -d /sys/fs/cgroup ]] || why+=("it needs cgroups mounted at /sys/fs/cgroup")
	if [[ "$(id -u)" == 0 ]] && command -v ip >/dev/null; then
		local probe="lw-probe-$$"
		if ip netns add "$probe" 2>/dev/null; then
			ip netns delete "$probe"
			netns_dir_down
		else
			why+=("it cannot create a network namespace here (ip netns add)")
		fi
	fi
	if [[ ${#why[@]} -gt 0 ]]; then
		local IFS=';'
		echo "the test cluster cannot run on this machine: ${why[*]}" >&2
		return 1
	fi
}

# netns_dir_down removes /run/netns once no namespace is left in it: `ip
# netns add` makes it a mount point of its own.
netns_dir_down() {
	[[ -d /run/netns && -z "$(ls -A /run/netns)" ]] || return 0
	while mountpoint -q /run/netns; do umount /run/netns || break; done
	rmdir /run/netns 2>/dev/null || true
}

missing_packages() {
	local missing=() want
	for want in containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins iptables:iptables conntrack:conntrack; do
		local probe="${want%%:*}" pkg="${want#*:}"
		if [[ "$probe" == /* ]]; then [[ -x "$probe" ]] || missing+=("$pkg"); else command -v "$probe" >/dev/null || missing+=("$pkg"); fi
	done
	echo "${missing[@]}"
	[[ ${#missing[@]} -eq 0 ]]
}

install_packages() {
	local missing
	missing="$(missing_packages)" && return 0
	log "installing ${missing} with apt-get"
	# policy-rc.d keeps Debian from starting a containerd of its own.
	local policy=/usr/sbin/policy-rc.d created=
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
	fi
	# shellcheck disable=SC2086 # one word per package
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing >"$dir/logs/apt-get.log" 2>&1 ||
		{ [[ -z $created ]] || rm -f "$policy"; die "apt-get install $missing failed: see $dir/logs/apt-get.log"; }
	[[ -z $created ]] || rm -f "$policy"
}

# ---------------------------------------------------------------------------
# Certificates: one CA, the API server's serving certificate, a client
# certificate per component, the service-account signing key.

pki() {
	local p="$dir/pki"
	mkdir -p "$p"
	openssl ecparam -name prime256v1 -genkey -noout -out "$p/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$p/ca.key" -subj /CN=lockwarden-test-cluster-ca -days 30 -out "$p/ca.crt" 2>/dev/null
	openssl ecparam -name prime256v1 -genkey -noout -out "$p/sa.key" 2>/dev/null
	openssl ec -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
	cert apiserver /CN=kube-apiserver server \
		"DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$node_ip,IP:$api_service_ip,IP:127.0.0.1"
	cert admin /O=system:masters/CN=kubernetes-admin client
	cert apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client client
	cert controller-manager /CN=system:kube-controller-manager client
	cert scheduler /CN=system:kube-scheduler client
	cert proxy /CN=system:kube-proxy client
	cert kubelet /O=system:nodes/CN=system:node:$node client
	cert kubelet-serving /CN=$node server "DNS:$node,IP:$node_ip"
}

cert() { # name subject server|client [subjectAltName]
	local p="$dir/pki" name="$1" subject="$2" usage="$3" san="${4:-}"
	local ext="keyUsage=critical,digitalSignature,keyEncipherment"
	if [[ $usage == server ]]; then ext+=$'\nextendedKeyUsage=serverAuth\nsubjectAltName='"$san"; else ext+=$'\nextendedKeyUsage=clientAuth'; fi
	openssl ecparam -name prime256v1 -genkey -noout -out "$p/$name.key" 2>/dev/null
	openssl req -new -key "$p/$name.key" -subj "$subject" -out "$p/$name.csr" 2>/dev/null
	openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 30 \
		-extfile <(printf '%s\n' "$ext") -out "$p/$name.crt" 2>/dev/null
	rm -f "$p/$name.csr"
}

kubeconfig() { # file server user cert-name
	local f="$1" server="$2" user="$3" c="$dir/pki/$4"
	"$bin/kubectl" --kubeconfig "$f" config set-cluster lockwarden-test --server "$server" --certificate-authority "$dir/pki/ca.crt" --embed-certs >/dev/null
	"$bin/kubectl" --kubeconfig "$f" config set-credentials "$user" --client-certificate "$c.crt" --client-key "$c.key" --embed-certs >/dev/null
	"$bin/kubectl" --kubeconfig "$f" config set-context lockwarden-test --cluster lockwarden-test --user "$user" >/dev/null
	"$bin/kubectl" --kubeconfig "$f" config use-context lockwarden-test >/dev/null
}

# ---------------------------------------------------------------------------
# The network namespace: a loopback, the node address on one end of a veth
# pair (the kernel here has no dummy device), forwarding and bridge
# netfilter for kube-proxy; all of it goes with the namespace.

network() {
	ip netns add "$netns"
	in_ns ip link set lo up
	in_ns ip link add lw0 type veth peer name lw1
	in_ns ip addr add "$node_ip/24" dev lw0
	in_ns ip link set lw0 up
	in_ns ip link set lw1 up
	in_ns ip route add default via "$node_peer" dev lw0
	in_ns sysctl -qw net.ipv4.ip_forward=1
	if [[ -e /proc/sys/net/bridge ]] || modprobe br_netfilter 2>/dev/null; then
		in_ns sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true
	fi
}

# The cgroup every Pod lives under, in each hierarchy (cgroup v1) or in the
# unified one (v2): the kubelet's cgroupRoot.
cgroup_dirs() {
	if [[ -e /sys/fs/cgroup/cgroup.controllers ]]; then
		echo "/sys/fs/cgroup/$cgroup_root"
		return
	fi
	local m
	for m in /sys/fs/cgroup/*/; do
		[[ -e "$m/cgroup.procs" ]] && echo "${m%/}/$cgroup_root"
	done
}

cgroups() {
	local d
	for d in $(cgroup_dirs); do
		mkdir -p "$d"
		if [[ -e "$d/cpuset.cpus" ]]; then # a v1 cpuset starts empty
			cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
			cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
		fi
	done
}

# ---------------------------------------------------------------------------
# The components: every flag in one place.

start() { # name command... : runs it in the namespace, detached, logging to logs/NAME.log
	local name="$1"
	shift
	setsid nsenter --net="/run/netns/$netns" -- "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
	echo $! >"$dir/pids/$name"
}

containerd_up() {
	local c="$dir/containerd"
	mkdir -p "$c/root" "$c/state" "$dir/cni/net.d" "$dir/cni/ipam"
	# restrict_oom_score_adj: this machine may not lower an oom_score_adj
	# (no CAP_SYS_RESOURCE), and containerd gives every sandbox -998.
	cat >"$c/config.toml" <<EOF
version = 2
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = "$c/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$c/state/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
	cat >"$dir/cni/net.d/10-lockwarden.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$netns",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam", "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	containerd_start
	load "$bin/pause.tar"
}

# load imports image tarballs into the cluster's containerd, where the
# kubelet finds them: no Pod ever pulls.
load() {
	local t
	for t in "$@"; do
		[[ -f "$t" ]] || die "no image tarball $t"
		ctr_ -n k8s.io images import "$t" >/dev/null
	done
}

containerd_start() {
	start containerd containerd --config "$dir/containerd/config.toml"
	wait_for "containerd" 30 ctr_ version
}

ctr_() { ctr --address "$dir/containerd/containerd.sock" "$@"; }

etcd_up() {
	start etcd "$bin/etcd" --name "$node" --data-dir "$dir/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster "$node=http://127.0.0.1:2380" --unsafe-no-fsync --log-level warn
}

apiserver_up() {
	local p="$dir/pki"
	start kube-apiserver "$bin/kube-apiserver" \
		--etcd-servers http://127.0.0.1:2379 \
		--advertise-address "$node_ip" --bind-address 0.0.0.0 --secure-port 6443 \
		--tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
		--client-ca-file "$p/ca.crt" \
		--kubelet-client-certificate "$p/apiserver-kubelet-client.crt" --kubelet-client-key "$p/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$p/ca.crt" \
		--kubelet-preferred-address-types InternalIP \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
		--service-cluster-ip-range "$service_cidr" \
		--authorization-mode Node,RBAC --allow-privileged=true \
		--profiling=false --v=1
}

controller_manager_up() {
	local p="$dir/pki"
	kubeconfig "$dir/controller-manager.kubeconfig" "https://$node_ip:6443" system:kube-controller-manager controller-manager
	start kube-controller-manager "$bin/kube-controller-manager" \
		--kubeconfig "$dir/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$dir/controller-manager.kubeconfig" --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false \
		--use-service-account-credentials=true \
		--service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
		--cluster-signing-cert-file "$p/ca.crt" --cluster-signing-key-file "$p/ca.key" \
		--service-cluster-ip-range "$service_cidr" --allocate-node-cidrs=false \
		--profiling=false --v=1
}

scheduler_up() {
	kubeconfig "$dir/scheduler.kubeconfig" "https://$node_ip:6443" system:kube-scheduler scheduler
	start kube-scheduler "$bin/kube-scheduler" \
		--kubeconfig "$dir/scheduler.kubeconfig" \
		--authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --profiling=false --v=1
}

kubelet_up() {
	local p="$dir/pki" k="$dir/kubelet"
	mkdir -p "$k" "$dir/pod-logs"
	kubeconfig "$dir/kubelet.kubeconfig" "https://$node_ip:6443" "system:node:$node" kubelet
	# failCgroupV1: Kubernetes 1.37 refuses cgroup v1 unless told otherwise.
	# syncFrequency is left at its default (1 minute), as on real clusters:
	# nothing lockwarden needs may wait for the kubelet to refresh a volume.
	# The image GC thresholds keep the images loaded from tarballs, which no
	# registry could give back.
	cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $p/kubelet-serving.crt
tlsPrivateKeyFile: $p/kubelet-serving.key
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$cgroup_root
failCgroupV1: false
failSwapOn: false
podLogsDir: $dir/pod-logs
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
maxPods: 60
EOF
	kubelet_start
}

kubelet_start() {
	start kubelet "$bin/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
		--root-dir "$dir/kubelet" --hostname-override "$node" --node-ip "$node_ip" --v=1
}

# restart_node kills the kubelet and containerd, as a crash would, and
# starts them again; the containers run on under their shims meanwhile.
restart_node() {
	running || die "no cluster is up in $dir"
	# shellcheck disable=SC2046 # one word per pid
	stop_pids KILL $(started kubelet containerd)
	mv "$dir/logs/containerd.log" "$dir/logs/containerd.log.$(date +%s)"
	mv "$dir/logs/kubelet.log" "$dir/logs/kubelet.log.$(date +%s)"
	containerd_start
	kubelet_start
	wait_for "node $node" 90 kubectl wait node "$node" --for=condition=Ready --timeout=2s
}

proxy_up() {
	kubeconfig "$dir/proxy.kubeconfig" "https://$node_ip:6443" system:kube-proxy proxy
	# conntrack zeros: leave the host-wide conntrack table size alone.
	cat >"$dir/proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/proxy.kubeconfig}
mode: iptables
hostnameOverride: $node
clusterCIDR: $pod_cidr
bindAddress: $node_ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
	start kube-proxy "$bin/kube-proxy" --config "$dir/proxy.yaml" --v=1
}

forward_up() {
	rm -f "$dir/apiserver.port"
	setsid "$bin/lockwarden-netns-forward" -netns "/run/netns/$netns" -to "$node_ip:6443" \
		-listen 127.0.0.1:0 -port-file "$dir/apiserver.port" >"$dir/logs/forward.log" 2>&1 </dev/null &
	echo $! >"$dir/pids/forward"
	wait_for "the API server's forwarded port" 10 test -s "$dir/apiserver.port"
	kubeconfig "$dir/kubeconfig" "https://127.0.0.1:$(cat "$dir/apiserver.port")" kubernetes-admin admin
}

wait_for() { # what seconds command...
	local what="$1" secs="$2" t0=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS - t0 >= secs)); then
			die "$what not ready after ${secs}s (logs in $dir/logs)"
		fi
		sleep 0.2
	done
}

running() { [[ -f "$dir/pids/kube-apiserver" ]] && kill -0 "$(cat "$dir/pids/kube-apiserver")" 2>/dev/null; }

up() {
	check || exit 1
	if running || ip netns list 2>/dev/null | grep -qw "$netns"; then
		die "a cluster is already up in $dir: hack/cluster/cluster.sh down (make cluster-down) first"
	fi
	local t0=$SECONDS tool
	for tool in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl pause.tar lockwarden-netns-forward; do
		[[ -e "$bin/$tool" ]] || die "$bin/$tool is missing: make cluster builds it (hack/build-tools.sh node)"
	done
	rm -rf "$dir"
	mkdir -p "$dir/logs" "$dir/pids"
	install_packages
	local s
	for s in "${kernel_settings[@]}"; do
		[[ -r /proc/sys/$s ]] && echo "$s $(cat "/proc/sys/$s")"
	done >"$dir/kernel-settings"
	printf 'NETNS=%s\nCGROUP_ROOT=%s\nCONTAINERD_ADDRESS=%s\nNODE=%s\nNODE_IP=%s\n' \
		"$netns" "$cgroup_root" "$dir/containerd/containerd.sock" "$node" "$node_ip" >"$dir/env"
	pki
	network
	cgroups
	log "certificates, namespace $netns, cgroups /$cgroup_root: $((SECONDS - t0))s"
	etcd_up
	containerd_up
	apiserver_up
	forward_up
	wait_for "the API server" 90 kubectl get --raw /readyz
	log "API server ready: $((SECONDS - t0))s"
	controller_manager_up
	scheduler_up
	kubelet_up
	proxy_up
	wait_for "node $node" 90 kubectl wait node "$node" --for=condition=Ready --timeout=2s
	wait_for "the default service account" 60 kubectl -n default get serviceaccount default
	log "node Ready: $((SECONDS - t0))s"
	echo "export KUBECONFIG=$dir/kubeconfig"
}

# ---------------------------------------------------------------------------
# down: whatever up got to, and whatever state the cluster is in.

pids_in_netns() {
	[[ -e "/run/netns/$netns" ]] || return 0
	local ino
	ino="$(stat -L -c %i "/run/netns/$netns")"
	find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/net' -lname "net:\[$ino\]" 2>/dev/null | cut -d/ -f3
}

pids_in_cgroups() {
	local d
	for d in $(cgroup_dirs); do
		[[ -d "$d" ]] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -u
}

# thaw lets frozen processes (the suite freezes a worker Pod) die.
thaw() {
	local d f
	for d in $(cgroup_dirs); do
		[[ -d "$d" ]] || continue
		while IFS= read -r f; do echo THAWED >"$f" 2>/dev/null || true; done < <(find "$d" -name freezer.state 2>/dev/null)
		while IFS= read -r f; do echo 0 >"$f" 2>/dev/null || true; done < <(find "$d" -name cgroup.freeze 2>/dev/null)
	done
}

stop_pids() { # signal-first pids...: TERM (or KILL), then KILL what is left after 5 s
	local sig="$1" p
	shift
	[[ $# -gt 0 ]] || return 0
	kill -s "$sig" "$@" 2>/dev/null || true
	for _ in $(seq 50); do
		local alive=()
		for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
		[[ ${#alive[@]} -gt 0 ]] || return 0
		sleep 0.1
	done
	kill -s KILL "$@" 2>/dev/null || true
}

started() { # names...: the pids up recorded for these components
	local n
	for n in "$@"; do
		[[ -f "$dir/pids/$n" ]] && cat "$dir/pids/$n"
	done
	return 0
}

# shim_sockets are the sockets containerd's shims bound in the cluster's
# namespace (under /run/containerd/s, wherever containerd's state is): a
# shim that is killed leaves its socket behind.
shim_sockets() {
	local p
	p="$(pids_in_netns | head -n1)"
	[[ -n "$p" ]] || return 0
	awk '$8 ~ "^/run/containerd/s/" {print $8}' "/proc/$p/net/unix" 2>/dev/null | sort -u
}

down() {
	local t0=$SECONDS sockets
	sockets="$(shim_sockets)"
	thaw
	# The node first, so that nothing restarts what the next steps stop.
	# shellcheck disable=SC2046 # one word per pid
	stop_pids TERM $(started kubelet kube-proxy kube-scheduler kube-controller-manager)
	# shellcheck disable=SC2046
	stop_pids KILL $(pids_in_cgroups)
	# shellcheck disable=SC2046
	stop_pids TERM $(started containerd)
	# shellcheck disable=SC2046
	stop_pids TERM $(started kube-apiserver forward)
	# shellcheck disable=SC2046
	stop_pids TERM $(started etcd)
	# Whatever is left in the namespace or the cgroups: containerd's shims.
	# shellcheck disable=SC2046
	stop_pids KILL $(pids_in_netns) $(pids_in_cgroups)
	local m
	if [[ -d "$dir" ]]; then
		while IFS= read -r m; do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done < <(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
	fi
	local d
	for d in $(cgroup_dirs); do
		[[ -d "$d" ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	ip netns delete "$netns" 2>/dev/null || true
	if [[ -f "$dir/kernel-settings" ]]; then
		local s v
		while read -r s v; do echo "$v" >"/proc/sys/$s" 2>/dev/null || true; done <"$dir/kernel-settings"
	fi
	# The kubelet links container logs from /var/log/containers; containerd's
	# CNI plugins keep results in /var/lib/cni.
	for f in /var/log/containers/*; do
		[[ -L "$f" && "$(readlink "$f")" == "$dir/"* ]] && rm -f "$f"
	done
	local f
	for f in /var/lib/cni/results/*; do
		[[ -f "$f" ]] && grep -qF "$dir/" "$f" && rm -f "$f"
	done
	rm -rf /var/lib/cni/networks/"$netns"
	# shellcheck disable=SC2086 # one word per socket
	[[ -z "$sockets" ]] || rm -f $sockets
	rmdir /var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd 2>/dev/null || true
	netns_dir_down
	rm -rf "$dir"
	verify_down
	log "down: $((SECONDS - t0))s"
}

# verify_down fails when anything of the cluster is left.
verify_down() {
	local left=()
	[[ -z "$(pids_in_netns)" ]] || left+=("processes in namespace $netns")
	[[ ! -e "/run/netns/$netns" ]] || left+=("namespace $netns")
	[[ -z "$(pids_in_cgroups)" ]] || left+=("processes in cgroups /$cgroup_root")
	local d
	for d in $(cgroup_dirs); do [[ ! -d "$d" ]] || left+=("cgroup $d"); done
	! awk -v d="$dir/" 'index($2, d) == 1 {found=1} END {exit !found}' /proc/self/mounts || left+=("mounts under $dir")
	[[ ${#left[@]} -eq 0 ]] || die "down left: ${left[*]}"
}

case "${1:-}" in
up) up ;;
down) down ;;
check) check ;;
restart-node) restart_node ;;
load)
	shift
	running || die "no cluster is up in $dir (make cluster)"
	load "$@"
	;;
*)
	echo "usage: $0 up|down|check|restart-node|load TARBALL..." >&2
	exit 2
	;;
esac
