//go:build tools

// Package tools pins helm, which lints and renders the chart in charts/lockwarden.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
