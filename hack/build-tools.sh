#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, etcd, etcdutl, kubectl),
# controller-gen and helm from the Go module proxy into bin/. A binary that is already
# there is not rebuilt. See DEVELOPERS.md.
#
# Usage: hack/build-tools.sh [tool ...]   (default: all but golangci-lint,
# which `make lint` builds on demand, and the node: kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy and pause, which
# `make cluster` builds on demand; `node` names all five)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${LOCALBIN:-$root/bin}"
mkdir -p "$bin"

K8S_VERSION=v1.37.2
K8S_MAJOR=1
K8S_MINOR=37
BUILD_DATE=2026-01-01T00:00:00Z
HELM_VERSION=v3.22.0

kube_ldflags() {
	local f=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		f+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
		f+=" -X ${pkg}.gitMajor=${K8S_MAJOR}"
		f+=" -X ${pkg}.gitMinor=${K8S_MINOR}"
		f+=" -X ${pkg}.gitCommit=0000000000000000000000000000000000000000"
		f+=" -X ${pkg}.gitTreeState=clean"
		f+=" -X ${pkg}.buildDate=${BUILD_DATE}"
	done
	echo "-s -w${f}"
}

build() { # name module-dir package [ldflags]
	local name="$1" dir="$2" pkg="$3" ldflags="${4:--s -w}"
	if [[ -x "$bin/$name" ]]; then
		return 0
	fi
	echo "building $name from the Go module proxy (first time only)" >&2
	(cd "$root/hack/tools/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
	mv "$bin/$name.tmp" "$bin/$name"
}

# pause_image builds the Pod sandbox's pause program and writes its image
# tarball, bin/pause.tar, named $PAUSE_IMAGE: the test cluster has no
# registry, so containerd imports it.
PAUSE_IMAGE=registry.k8s.io/pause:3.10-lockwarden
pause_image() {
	build pause pause ./cmd/pause
	if [[ -f "$bin/pause.tar" && "$bin/pause.tar" -nt "$bin/pause" ]]; then
		return 0
	fi
	(cd "$root/hack/tools/pause" && CGO_ENABLED=0 go run . -binary "$bin/pause" -image "$PAUSE_IMAGE" -out "$bin/pause.tar")
}

want=()
for t in "$@"; do
	case "$t" in
	node) want+=(kubelet kube-controller-manager kube-scheduler kube-proxy pause) ;;
	*) want+=("$t") ;;
	esac
done
[[ ${#want[@]} -gt 0 ]] || want=(controller-gen etcd etcdutl kube-apiserver kubectl helm)
for t in "${want[@]}"; do
	case "$t" in
	controller-gen) build controller-gen controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen ;;
	etcd) build etcd etcd go.etcd.io/etcd/server/v3 ;;
	etcdutl) build etcdutl etcd go.etcd.io/etcd/etcdutl/v3 ;;
	kube-apiserver) build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$(kube_ldflags)" ;;
	kubectl) build kubectl kube k8s.io/kubernetes/cmd/kubectl "$(kube_ldflags)" ;;
	kubelet | kube-controller-manager | kube-scheduler | kube-proxy)
		build "$t" kube "k8s.io/kubernetes/cmd/$t" "$(kube_ldflags)" ;;
	pause) pause_image ;;
	helm) build helm helm helm.sh/helm/v3/cmd/helm "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" ;;
	golangci-lint) build golangci-lint golangci-lint . ;;
	*) echo "unknown tool: $t" >&2; exit 2 ;;
	esac
done
