#!/usr/bin/env bash
# Builds the manager image of an earlier commit (the previous release, for
# the real-node suite's rolling upgrade) with that commit's own `make image`,
# in a throw-away git worktree, loads it into the test cluster, and writes
# that commit's Helm chart to dist/previous/chart-VERSION/lockwarden.
#
# Usage: hack/cluster/previous-image.sh REF IMAGE_REPO ARCH
# Prints nothing on success; the image is IMAGE_REPO:$(git describe --tags --always REF).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ref="$1" repo="$2" arch="$3"
version="$(git -C "$root" describe --tags --always "$ref")"
dist="$root/dist/previous"
tarball="$dist/lockwarden-manager-$version-linux-$arch.tar"

if [[ ! -f "$tarball" ]]; then
	wt="$root/.tmp/previous-$version"
	git -C "$root" worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
	git -C "$root" worktree add --detach "$wt" "$ref" >/dev/null
	trap 'git -C "$root" worktree remove --force "$wt"' EXIT
	echo "building the image of $ref ($version)" >&2
	make -C "$wt" --no-print-directory image IMAGE_ARCHS="$arch" VERSION="$version" IMG="$repo:$version" DIST="$dist" >&2
fi
chart="$dist/chart-$version"
if [[ ! -f "$chart/lockwarden/Chart.yaml" ]]; then
	rm -rf "$chart"
	mkdir -p "$chart"
	git -C "$root" archive "$ref" charts/lockwarden | tar -x -C "$chart" --strip-components=1
fi
"$root/hack/cluster/cluster.sh" load "$tarball"
