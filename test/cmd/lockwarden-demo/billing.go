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

// workers maps each actor of the story to its service account in billing.
var workers = map[string]string{"A": "worker-a", "B": "worker-b"}

// workerRole is what a settlement worker may do in billing: take and give
// back leases, read fence records, and write ConfigMaps (the guarded one
// included; admission, not RBAC, decides which writes are fenced).
const workerRole = "settlement-worker"

// setupBilling creates the billing namespace, the worker service accounts,
// their Role and RoleBinding, and one client-certificate identity per
// worker, authenticated as that service account. It returns each actor's
// kubeconfig path once RBAC lets both identities create LockGrants.
func setupBilling(ctx context.Context, cp *localcp.ControlPlane, c client.Client, dir string) (map[string]string, error) {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: billingNamespace}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: workerRole, Namespace: billingNamespace},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"}},
				{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"lockgrants/status"}, Verbs: []string{"get"}},
				{APIGroups: []string{lockingv1alpha1.GroupVersion.Group}, Resources: []string{"fencecounters"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: workerRole, Namespace: billingNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: workerRole},
	}
	for _, sa := range []string{workers["A"], workers["B"]} {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: billingNamespace}})
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: billingNamespace})
	}
	objs = append(objs, binding)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}

	kubeconfigs := map[string]string{}
	for actor, sa := range workers {
		user := serviceAccountUser(sa)
		path, err := cp.AddUser(sa, envtest.User{
			Name:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + billingNamespace, "system:authenticated"},
		})
		if err != nil {
			return nil, err
		}
		if err := waitAllowed(ctx, c, user); err != nil {
			return nil, err
		}
		kubeconfigs[actor] = path
	}
	return kubeconfigs, nil
}

// serviceAccountUser is the user name Kubernetes gives a service account of
// billing.
func serviceAccountUser(sa string) string {
	return "system:serviceaccount:" + billingNamespace + ":" + sa
}

// waitAllowed waits until the API server's authorizer lets user create
// LockGrants in billing: the RoleBinding is in effect.
func waitAllowed(ctx context.Context, c client.Client, user string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: billingNamespace, Verb: "create",
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
