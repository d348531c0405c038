#!/usr/bin/env bash
# Prints the smallest issuer epoch above every epoch that any guarded
# object in the cluster has recorded: the epoch to give the FenceIssuer
# when FenceCounters were lost (CRDs deleted, or etcd restored from an old
# snapshot). A fence is epoch << 40 | sequence, so an object's recorded
# fence (annotation locking.lockwarden.io/fence) names its epoch.
#
# Fences recorded outside the cluster count too: pass them as arguments,
# e.g. from the PostgreSQL store:
#   hack/next-epoch.sh $(psql -Atc 'SELECT max(fence) FROM lockwarden_fences')
#
# Usage: KUBECTL=kubectl hack/next-epoch.sh [FENCE...]
set -euo pipefail

kubectl="${KUBECTL:-kubectl}"
max=0
consider() {
	local f="$1"
	[[ "$f" =~ ^[0-9]+$ ]] || return 0
	((f > max)) && max="$f"
	return 0
}
for f in "$@"; do consider "$f"; done
for r in $($kubectl api-resources --verbs=list -o name); do
	for f in $($kubectl get "$r" -A -l locking.lockwarden.io/guarded=true --ignore-not-found \
		-o jsonpath='{range .items[*]}{.metadata.annotations.locking\.lockwarden\.io/fence}{" "}{end}' 2>/dev/null || true); do
		consider "$f"
	done
done
if ((max == 0)); then
	echo 0
else
	echo $(((max >> 40) + 1))
fi
