#!/usr/bin/env bash
# make undeploy: removes what config/default installed and what the manager
# created at run time, in an order that leaves the cluster writable:
#   1. the manager Deployment, and waits for its pods to go, so that nothing
#      recreates a webhook configuration behind us;
#   2. everything else config/default installed, except the CRDs (they hold
#      every FenceCounter and the FenceIssuer) unless DELETE_CRDS is true;
#   3. the GuardPolicy webhook configurations the manager created (labeled
#      app.kubernetes.io/managed-by=lockwarden-manager). An Enforce one left
#      behind would refuse every write to the objects it selects.
#
# Usage: hack/undeploy.sh KUBECTL DELETE_CRDS
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kubectl="${1:-kubectl}"
delete_crds="${2:-false}"
namespace=lockwarden-system

rendered="$($kubectl kustomize "$root/config/default")"

$kubectl delete --ignore-not-found -n "$namespace" deployment lockwarden-controller-manager
$kubectl wait --for=delete pod -n "$namespace" -l control-plane=controller-manager --timeout=120s 2>/dev/null || true

if [[ "$delete_crds" == true ]]; then
	echo "WARNING: deleting the CRDs deletes every FenceCounter and the FenceIssuer: fences and epochs restart at 1 and 0, and objects that recorded a higher fence refuse new holders (README: Uninstall)." >&2
	printf '%s\n' "$rendered" | $kubectl delete --ignore-not-found --wait=false -f -
else
	# Drop the CustomResourceDefinition documents.
	printf '%s\n' "$rendered" |
		awk 'BEGIN { RS = "\n---\n" } $0 !~ /(^|\n)kind: CustomResourceDefinition(\n|$)/ { printf "%s\n---\n", $0 }' |
		$kubectl delete --ignore-not-found --wait=false -f -
	echo "CRDs kept: every FenceCounter and the FenceIssuer stay, so a later install continues their fences. DELETE_CRDS=true deletes them." >&2
fi

$kubectl delete --ignore-not-found validatingwebhookconfigurations,mutatingwebhookconfigurations \
	-l app.kubernetes.io/managed-by=lockwarden-manager
