//go:build tools

// Package tools pins the Kubernetes control-plane binaries that the local
// test and demo control plane is built from (kube-apiserver, kubectl).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
