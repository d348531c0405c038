// Package integration tests the controller and the admission webhooks
// together, on a real kube-apiserver and etcd (envtest, binaries from
// bin/), with every user action made under its own impersonated identity.
//
// The manager runs in the test process with a fake clock shared by the
// controller and the webhooks, so lease timing is stepped, not waited for.
// A fake clock cannot fire the controller's RequeueAfter timer, so a test
// that needs the controller to notice a deadline passing touches the grant
// (wake), which is what the timer would have done.
package integration
