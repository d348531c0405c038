// Package install verifies lockwarden the way a platform engineer installs
// it, on a local control plane (etcd and kube-apiserver from bin/, RBAC on,
// no kubelet): dist/install.yaml from `make build-installer` and the Helm
// chart are applied as they are, and the manager runs as a process with the
// flags, environment and service account token their Deployment gives it.
// Then the paused-holder story runs against that installation, and an
// uninstall and reinstall (`make undeploy`/`make deploy`, `helm uninstall`/
// `helm install`) must keep every FenceCounter and the FenceIssuer and leave
// the cluster writable.
//
// What a cluster would do and this machine cannot is done by the test, and
// only that: the API server reaches the webhooks on localhost rather than
// through the Service (so the manager's certificate is issued for localhost
// and it reads its Secret rather than a kubelet mount), and after
// `make undeploy` the test empties and finalizes the deleted namespace as
// the namespace controller would.
package install
