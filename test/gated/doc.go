// Package gated tests lock-gated Pods (docs/gated-workloads.md) on a real
// kube-apiserver and etcd (envtest, binaries from bin/), with the
// manager's controllers and webhooks in the test process on a fake clock.
//
// envtest runs no scheduler, kubelet or Job controller, so the tests play
// them: a test binds a Pod to a node through the pods/binding subresource
// (as the scheduler does), sets its status phase (as the kubelet does),
// renews the node's Lease in kube-node-lease (as the kubelet's heartbeat
// does), and creates a Job's Pods from its template (as the Job controller
// does). Each namespace has its own RBAC, so that one ServiceAccount may
// acquire and another may not; nothing is granted cluster-wide.
package gated
