#!/usr/bin/env bash
# Builds the manager image of an earlier commit (the previous release, for
# the real-node suite's rolling upgrade) with that commit's own `make image`,
# in a throw-away git worktree, and loads it into the test cluster.
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
"$root/hack/cluster/cluster.sh" load "$tarball"
