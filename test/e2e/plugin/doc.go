// Package plugin tests `kubectl lock` as a user runs it: the real
// kubectl-lock binary, built from cmd/kubectl-lock and invoked through
// kubectl's plugin mechanism (bin/kubectl finds it on PATH), against a local
// control plane (kube-apiserver and etcd from bin/, via envtest) with the
// controller and the admission webhooks running in the test process on the
// real clock. Users are client-certificate identities with their own
// kubeconfigs.
//
// Lease timing is real here (TTLs of a few seconds); tests wait for
// outcomes with deadlines and polling, never by sleeping.
package plugin
