#!/usr/bin/env bash
# make release-archives: builds the kubectl plugin (kubectl-lockwarden, from
# ./cmd/kubectl-lock) for each OS/ARCH, packs it with LICENSE and README.md
# as krew expects (tar.gz; zip for Windows when `zip` is installed, else
# tar.gz), writes SHA-256 sums, and fills hack/krew/lockwarden.yaml into the
# plugin's krew manifest.
#
# Usage: hack/release-archives.sh VERSION LDFLAGS OUTDIR OS/ARCH...
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="$1" ldflags="$2" out="$3"
shift 3
base_url="${KREW_BASE_URL:-https://github.com/lockwarden/lockwarden/releases/download/$version}"
mkdir -p "$out"
rm -f "$out/checksums.txt.tmp"
manifest="$(sed "s|{{VERSION}}|$version|g" "$root/hack/krew/lockwarden.yaml")"

for platform in "$@"; do
	os="${platform%/*}" arch="${platform#*/}"
	name="kubectl-lockwarden_${version}_${os}_${arch}"
	stage="$out/$name"
	rm -rf "$stage" && mkdir -p "$stage"
	exe=kubectl-lockwarden
	[[ "$os" == windows ]] && exe+=.exe
	(cd "$root" && CGO_ENABLED=0 GOOS="$os" GOARCH="$arch" go build -trimpath -ldflags "-s -w $ldflags" -o "$stage/$exe" ./cmd/kubectl-lock)
	cp "$root/LICENSE" "$root/README.md" "$stage/"
	if [[ "$os" == windows ]] && command -v zip >/dev/null; then
		archive="$name.zip"
		(cd "$stage" && zip -q -X "../$archive" "$exe" LICENSE README.md)
	else
		archive="$name.tar.gz"
		tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -czf "$out/$archive" "$exe" LICENSE README.md
	fi
	rm -rf "$stage"
	sum="$(sha256sum "$out/$archive" | cut -d' ' -f1)"
	echo "$sum  $archive" >>"$out/checksums.txt.tmp"
	key="$(echo "${os}_${arch}" | tr a-z A-Z)"
	manifest="${manifest//\{\{URL_$key\}\}/$base_url/$archive}"
	manifest="${manifest//\{\{SHA256_$key\}\}/$sum}"
	echo "$out/$archive"
done
mv "$out/checksums.txt.tmp" "$out/checksums.txt"
# Platforms that were not built leave the manifest.
printf '%s\n' "$manifest" | awk '
	/^  - selector:/ { if (block != "" && block !~ /\{\{/) printf "%s", block; block = $0 "\n"; next }
	block != "" { block = block $0 "\n"; next }
	{ print }
	END { if (block != "" && block !~ /\{\{/) printf "%s", block }' >"$out/lockwarden.yaml"
echo "$out/lockwarden.yaml (krew manifest)"
