//go:build tools

// Package tools pins the Kubernetes binaries built from k8s.io/kubernetes:
// the local test and demo control plane (kube-apiserver, kubectl) and the
// node components of the one-node test cluster (kubelet,
// kube-controller-manager, kube-scheduler, kube-proxy; `make cluster`).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
