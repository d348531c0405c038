// Package chart checks the Helm chart in charts/lockwarden with the helm
// binary built into bin/: it lints and renders with the default values and
// with ci/ha-certmanager-values.yaml, and checks that what it installs
// matches config/default (the webhooks, CRDs and the manager's flags) and
// keeps what users rely on: CRDs kept on uninstall, non-root pods, secure
// metrics, cert-manager's CA injection when enabled.
package chart
