package lockgrant

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ManagedByLabel marks the FenceCounters this controller creates.
const ManagedByLabel = "app.kubernetes.io/managed-by"

func ctrlObjectMeta(req reconcile.Request) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: req.Namespace,
		Name:      req.Name,
		Labels:    map[string]string{ManagedByLabel: "lockwarden"},
	}
}
