package main

import (
	"context"
	"fmt"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/test/internal/localcp"
)

// workerRole is what a chaos worker may do in its namespace: take and give
// back leases, and write ConfigMaps (admission, not RBAC, decides which
// writes to guarded ones are accepted).
const workerRole = "chaos-worker"

// workerName is the name, service account and history process of worker i.
func workerName(i int) string { return fmt.Sprintf("worker-%d", i) }

// workerUser is the Kubernetes user name of worker i. Worker 1 is a replica
// of worker 0's Deployment: it runs as worker 0's service account, so the
// two hold grants under one identity and only the claim each write asserts
// tells their writes apart.
func workerUser(i int) string {
	return "system:serviceaccount:" + chaosNamespace + ":" + workerName(identityOf(i))
}

// identityOf is the index of the service account worker i runs as.
func identityOf(i int) int {
	if i == 1 {
		return 0
	}
	return i
}

// replicaOf is the name of the other worker that runs as worker i's
// service account, or "".
func replicaOf(i, workers int) string {
	switch {
	case workers < 2:
		return ""
	case i == 0:
		return workerName(1)
	case i == 1:
		return workerName(0)
	}
	return ""
}

// setupIdentities creates the namespace, the workers' service accounts,
// Role and RoleBinding, and one client-certificate identity per worker,
// authenticated as its service account and reaching the API server at
// servers[i]. It returns each worker's kubeconfig path once RBAC lets it
// create LockGrants.
func setupIdentities(ctx context.Context, cp *localcp.ControlPlane, c client.Client, servers []string) ([]string, error) {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chaosNamespace}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: workerRole, Namespace: chaosNamespace},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch"}},
				{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"fencecounters"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: workerRole, Namespace: chaosNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: workerRole},
	}
	for i := range servers {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: workerName(i), Namespace: chaosNamespace}})
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: workerName(i), Namespace: chaosNamespace})
	}
	objs = append(objs, binding)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}

	kubeconfigs := make([]string, len(servers))
	for i, server := range servers {
		// The kubeconfig is the worker's own (its own fault proxy), the
		// identity in it may be shared (identityOf).
		path, err := addUser(cp, workerName(i), envtest.User{
			Name:   workerUser(i),
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + chaosNamespace, "system:authenticated"},
		}, server)
		if err != nil {
			return nil, err
		}
		if err := waitAllowed(ctx, c, workerUser(i)); err != nil {
			return nil, err
		}
		kubeconfigs[i] = path
	}
	return kubeconfigs, nil
}

// addUser provisions a client-certificate identity and writes a kubeconfig
// for it that reaches the API server at server (its fault proxy), returning
// its path.
func addUser(cp *localcp.ControlPlane, file string, u envtest.User, server string) (string, error) {
	path, err := cp.AddUser(file, u)
	if err != nil {
		return "", err
	}
	return pointKubeconfig(cp, path, file, server)
}

// waitAllowed waits until the API server's authorizer lets user create
// LockGrants in the namespace: the RoleBinding is in effect.
func waitAllowed(ctx context.Context, c client.Client, user string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: chaosNamespace, Verb: "create",
				Group: lockingv1alpha1.GroupVersion.Group, Resource: "lockgrants",
			},
		}}
		if err := c.Create(ctx, sar); err != nil {
			return false, err
		}
		return sar.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for RBAC to let %s create LockGrants: %w", user, err)
	}
	return nil
}
