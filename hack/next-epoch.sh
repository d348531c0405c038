#!/usr/bin/env bash
# Prints the smallest issuer epoch above every epoch that the cluster has
# recorded: the epoch to give the FenceIssuer when FenceCounters were lost
# (CRDs deleted, or etcd restored from an old snapshot). A fence is
# epoch << 40 | sequence, so a recorded fence names its epoch.
#
# It reads every object of every kind it can list, in all namespaces, that
# carries the annotation locking.lockwarden.io/accepted-fence: objects
# guarded by the label, objects a GuardPolicy covers, and objects no longer
# guarded (a record counts again if they are guarded again). It also reads
# every FenceCounter's spec.fence. A record an administrator overrode
# (accepted-intent "override": a wedged object being retired) is reported
# but not counted. What it found is summed up on stderr; stdout carries only
# the epoch.
#
# Fences recorded outside the cluster count too: pass them as arguments,
# e.g. from the PostgreSQL store:
#   hack/next-epoch.sh $(psql -Atc 'SELECT max(fence) FROM lockwarden_fences')
#
# Exit status: 0 with the epoch on stdout; 2 when a recorded fence is of the
# last epoch (8388607), above which no epoch exists (the CRD refuses
# 8388608): the objects that hold one are listed, and docs/runbook.md ("An
# object wedged in the last epoch") says how to retire them; 3 when a kind
# could not be listed (its fences would be missed), unless
# ALLOW_UNREADABLE=1.
#
# Usage: KUBECTL=kubectl hack/next-epoch.sh [FENCE...]
set -euo pipefail

kubectl="${KUBECTL:-kubectl}"
readonly bits=40 max_epoch=8388607
max=0
max_from="nothing"
wedged=()
unreadable=()

# isfence TEXT: a fence as lockwarden writes it (decimal, 1 to 2^63-1).
isfence() {
	[[ "$1" =~ ^[1-9][0-9]{0,18}$ ]] && ! { ((${#1} == 19)) && [[ "$1" > "9223372036854775807" ]]; }
}

# consider FENCE WHERE: counts one recorded fence; a malformed one (which
# admission never writes, and never counts) is reported and skipped.
consider() {
	local f="$1" where="$2"
	if ! isfence "$f"; then
		echo "next-epoch: ignoring ${where}: ${f@Q} is not a fence" >&2
		return 0
	fi
	if (((f >> bits) >= max_epoch)); then
		wedged+=("$where (fence $f)")
	fi
	if ((f > max)); then
		max="$f"
		max_from="$where"
	fi
	return 0
}

for f in "$@"; do
	if ! isfence "$f"; then
		echo "next-epoch: argument ${f@Q} is not a fence (a decimal from 1 to 9223372036854775807)" >&2
		exit 1
	fi
	consider "$f" "argument $f"
done

kinds=$($kubectl api-resources --verbs=list -o name)
jsonpath='{range .items[*]}{.metadata.namespace}{"|"}{.metadata.name}{"|"}{.metadata.annotations.locking\.lockwarden\.io/accepted-fence}{"|"}{.metadata.annotations.locking\.lockwarden\.io/accepted-intent}{"\n"}{end}'
while read -r kind; do
	if ! out=$($kubectl get "$kind" --all-namespaces --ignore-not-found -o jsonpath="$jsonpath" 2>&1); then
		unreadable+=("$kind: ${out%%$'\n'*}")
		continue
	fi
	while IFS='|' read -r ns name fence intent; do
		[[ -n "$fence" ]] || continue
		where="$kind ${ns:+$ns/}$name"
		if [[ "$intent" == override ]]; then
			echo "next-epoch: not counting $where (fence $fence): an administrator overrode its guard" >&2
			continue
		fi
		consider "$fence" "$where"
	done <<<"$out"
done <<<"$kinds"

if counters=$($kubectl get fencecounters.locking.lockwarden.io --all-namespaces --ignore-not-found \
	-o jsonpath='{range .items[*]}{.metadata.namespace}{"|"}{.metadata.name}{"|"}{.spec.fence}{"\n"}{end}' 2>&1); then
	while IFS='|' read -r ns name fence; do
		[[ -n "$fence" && "$fence" != 0 ]] && consider "$fence" "fencecounter $ns/$name"
	done <<<"$counters"
else
	unreadable+=("fencecounters.locking.lockwarden.io: ${counters%%$'\n'*}")
fi

if ((${#unreadable[@]} > 0)); then
	printf 'next-epoch: could not list %s\n' "${unreadable[@]}" >&2
	if [[ "${ALLOW_UNREADABLE:-}" != 1 ]]; then
		echo "next-epoch: fences recorded there would be missed; list them with an identity that may, or set ALLOW_UNREADABLE=1 to go on without them" >&2
		exit 3
	fi
fi

if ((${#wedged[@]} > 0)); then
	echo "next-epoch: these fences are of the last issuer epoch, $max_epoch; no epoch is above them:" >&2
	printf '  %s\n' "${wedged[@]}" >&2
	echo "next-epoch: an object that recorded one can never be written under a grant again. Retire it with an administrator's override (docs/runbook.md, \"An object wedged in the last epoch\"), then run this again. A fence passed as an argument (a store outside the cluster): that resource can take no later fence; move its writes to another resource ID and leave the fence out." >&2
	exit 2
fi

if ((max == 0)); then
	echo "next-epoch: no recorded fence found" >&2
	echo 0
else
	echo "next-epoch: the highest recorded fence is $max (epoch $((max >> bits))), on $max_from" >&2
	echo $(((max >> bits) + 1))
fi
