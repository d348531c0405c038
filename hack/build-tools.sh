#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, etcd, etcdutl, kubectl),
# controller-gen and helm from the Go module proxy into bin/. A binary that is already
# there is not rebuilt. Tools of one module are built by one go command, and
# the modules' go commands run at the same time. See DEVELOPERS.md.
#
# Usage: hack/build-tools.sh [tool ...]   (default: all but golangci-lint,
# which `make lint` builds on demand, and the node: kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy and pause, which
# `make cluster` builds on demand; `node` names all five; `control-plane`
# names kube-apiserver, etcd and kubectl, all that `make demo` and the envtest
# suites use)
#
# When KUBEBUILDER_ASSETS names another directory than bin/ (setup-envtest's,
# as kubebuilder users have one), its kube-apiserver, etcd and kubectl are
# linked into bin/ instead of being built.
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

# binary_name is the name go build gives the main package pkg: its last path
# element, or the one before a major version suffix (go.etcd.io/etcd/server/v3
# is "server").
binary_name() {
	local pkg="${1%/}" last="${1##*/}"
	if [[ "$last" =~ ^v[0-9]+$ && "$pkg" == */* ]]; then
		pkg="${pkg%/*}"
		last="${pkg##*/}"
	fi
	echo "$last"
}

build() { # module-dir ldflags name=package ...: one go command builds those missing
	local dir="$1" ldflags="$2"
	shift 2
	local names=() pkgs=() np
	for np in "$@"; do
		if [[ ! -x "$bin/${np%%=*}" ]]; then
			names+=("${np%%=*}")
			pkgs+=("${np#*=}")
		fi
	done
	[[ ${#names[@]} -gt 0 ]] || return 0
	echo "building ${names[*]} from the Go module proxy (first time only)" >&2
	local tmp i
	tmp="$(mktemp -d "$bin/.build-$dir.XXXXXX")"
	local out="$tmp/${names[0]}"
	[[ ${#pkgs[@]} -eq 1 ]] || out="$tmp/"
	if ! (cd "$root/hack/tools/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out" "${pkgs[@]}"); then
		rm -rf "$tmp"
		return 1
	fi
	if [[ ${#pkgs[@]} -gt 1 ]]; then
		for i in "${!names[@]}"; do
			mv "$tmp/$(binary_name "${pkgs[$i]}")" "$tmp/${names[$i]}.out"
		done
		for i in "${!names[@]}"; do
			mv "$tmp/${names[$i]}.out" "$tmp/${names[$i]}"
		done
	fi
	for i in "${!names[@]}"; do
		mv "$tmp/${names[$i]}" "$bin/${names[$i]}"
	done
	rmdir "$tmp"
	echo "built ${names[*]}" >&2
}

# from_assets links tool from $KUBEBUILDER_ASSETS into bin/ when that is
# another directory holding it, and says so; it fails when it did not.
from_assets() {
	local t="$1" assets="${KUBEBUILDER_ASSETS:-}"
	[[ -n "$assets" && -d "$assets" && -x "$assets/$t" ]] || return 1
	[[ "$(cd "$assets" && pwd -P)" != "$(cd "$bin" && pwd -P)" ]] || return 1
	local src
	src="$(cd "$assets" && pwd -P)/$t"
	if [[ "$(readlink "$bin/$t" 2>/dev/null)" != "$src" ]]; then
		ln -sfn "$src" "$bin/$t"
	fi
	local version=""
	case "$t" in
	kube-apiserver) version="$("$src" --version 2>/dev/null | head -1)" ;;
	kubectl) version="$("$src" version --client 2>/dev/null | head -1)" ;;
	etcd) version="$("$src" --version 2>/dev/null | head -1)" ;;
	esac
	echo "$t: using $src from KUBEBUILDER_ASSETS, not building it${version:+ ($version)}" >&2
}

# pause_image builds the Pod sandbox's pause program and writes its image
# tarball, bin/pause.tar, named $PAUSE_IMAGE: the test cluster has no
# registry, so containerd imports it.
PAUSE_IMAGE=registry.k8s.io/pause:3.10-lockwarden
pause_image() {
	build pause "-s -w" pause=./cmd/pause
	if [[ -f "$bin/pause.tar" && "$bin/pause.tar" -nt "$bin/pause" ]]; then
		return 0
	fi
	(cd "$root/hack/tools/pause" && CGO_ENABLED=0 go run . -binary "$bin/pause" -image "$PAUSE_IMAGE" -out "$bin/pause.tar")
}

want=()
for t in "$@"; do
	case "$t" in
	node) want+=(kubelet kube-controller-manager kube-scheduler kube-proxy pause) ;;
	control-plane) want+=(kube-apiserver etcd kubectl) ;;
	*) want+=("$t") ;;
	esac
done
[[ ${#want[@]} -gt 0 ]] || want=(controller-gen etcd etcdutl kube-apiserver kubectl helm)

# Group the wanted tools by module: each group is one go command.
kube=() etcd=() others=()
for t in "${want[@]}"; do
	case "$t" in
	kube-apiserver | kubectl)
		from_assets "$t" || kube+=("$t=k8s.io/kubernetes/cmd/$t") ;;
	kubelet | kube-controller-manager | kube-scheduler | kube-proxy)
		kube+=("$t=k8s.io/kubernetes/cmd/$t") ;;
	etcd) from_assets etcd || etcd+=("etcd=go.etcd.io/etcd/server/v3") ;;
	etcdutl) etcd+=("etcdutl=go.etcd.io/etcd/etcdutl/v3") ;;
	controller-gen | pause | helm | golangci-lint) others+=("$t") ;;
	*) echo "unknown tool: $t" >&2; exit 2 ;;
	esac
done

pids=()
if [[ ${#kube[@]} -gt 0 ]]; then
	build kube "$(kube_ldflags)" "${kube[@]}" &
	pids+=($!)
fi
if [[ ${#etcd[@]} -gt 0 ]]; then
	build etcd "-s -w" "${etcd[@]}" &
	pids+=($!)
fi
for t in ${others[@]+"${others[@]}"}; do
	case "$t" in
	controller-gen) build controller-gen "-s -w" controller-gen=sigs.k8s.io/controller-tools/cmd/controller-gen & ;;
	pause) pause_image & ;;
	helm) build helm "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" helm=helm.sh/helm/v3/cmd/helm & ;;
	golangci-lint) build golangci-lint "-s -w" golangci-lint=. & ;;
	esac
	pids+=($!)
done
failed=0
for p in ${pids[@]+"${pids[@]}"}; do
	wait "$p" || failed=1
done
exit "$failed"
