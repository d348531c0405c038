package main

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// certSecret keeps the webhook certificate Secret in existence. The
// rotator (open-policy-agent/cert-controller) only ever updates that
// Secret: without it, it cannot start, and a replica that starts while the
// Secret is missing would exit, so that after a rollout no replica would
// serve the webhooks. So the manager creates the Secret, empty, when it
// is missing at start (ensure, before the rotator starts) and again
// whenever it is deleted while the manager runs (Start); the rotator then
// issues a new CA and serving certificate into it and injects the CA into
// the webhook configurations, as on a first install. Each creation is
// logged and recorded as a Warning Event on the new Secret.
//
// A Secret deleted while the manager runs is created again with the labels
// and annotations it had (an installer's ownership marks, such as Helm's),
// without its data, unless the webhook configuration is gone too: then the
// installation is being removed (helm uninstall and kubectl delete remove
// the webhook configurations before the Secret), and a Secret created again
// would outlive it.
type certSecret struct {
	clientset kubernetes.Interface
	key       types.NamespacedName
	// webhookConfig is the ValidatingWebhookConfiguration the Secret's CA
	// is injected into. A Secret deleted after it (an uninstall deletes
	// the webhook configurations before the Secret) is not created again.
	webhookConfig string
	// recorder, if set, records an Event on each Secret created.
	recorder events.EventRecorder
}

var _ manager.LeaderElectionRunnable = (*certSecret)(nil)

// NeedLeaderElection is false: every replica serves webhooks, and any of
// them may be the one that starts first after the Secret was deleted.
func (*certSecret) NeedLeaderElection() bool { return false }

// ensure creates the Secret, empty and with meta's labels and annotations,
// unless it exists. It reports whether it created it. Another replica
// creating it at the same moment is no error.
func (s *certSecret) ensure(ctx context.Context, meta metav1.ObjectMeta) (bool, error) {
	secrets := s.clientset.CoreV1().Secrets(s.key.Namespace)
	if _, err := secrets.Get(ctx, s.key.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		if err != nil {
			return false, fmt.Errorf("reading the webhook certificate Secret %s: %w", s.key, err)
		}
		return false, nil
	}
	labels := maps.Clone(meta.Labels)
	if len(labels) == 0 {
		labels = map[string]string{"app.kubernetes.io/name": "lockwarden"}
	}
	created, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.key.Namespace, Name: s.key.Name,
			Labels: labels, Annotations: maps.Clone(meta.Annotations),
		},
		Type: corev1.SecretTypeOpaque,
	}, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return false, nil
	case apierrors.IsForbidden(err):
		return false, fmt.Errorf("the webhook certificate Secret %s does not exist and the manager may not create it: create it empty (kubectl -n %s create secret generic %s) or grant the manager create on secrets in %s: %w",
			s.key, s.key.Namespace, s.key.Name, s.key.Namespace, err)
	case err != nil:
		return false, fmt.Errorf("creating the webhook certificate Secret %s: %w", s.key, err)
	}
	logf.FromContext(ctx).Info("Created the missing webhook certificate Secret; the rotator issues a new CA and serving certificate into it", "secret", s.key.String())
	if s.recorder != nil {
		s.recorder.Eventf(created, nil, corev1.EventTypeWarning, lockingv1alpha1.EventReasonCertificateSecretCreated, "Create",
			"The webhook certificate Secret was missing; the manager created it, and issues a new CA and serving certificate into it")
	}
	return true, nil
}

// Start watches the Secret until ctx ends, and creates it again whenever
// it is deleted (or found missing when the watch starts).
func (s *certSecret) Start(ctx context.Context) error {
	logger := logf.FromContext(ctx).WithValues("secret", s.key.String())
	lw := toolscache.NewListWatchFromClient(s.clientset.CoreV1().RESTClient(), "secrets", s.key.Namespace,
		fields.OneTermEqualSelector("metadata.name", s.key.Name))
	recreate := func(meta metav1.ObjectMeta) {
		if s.webhookConfig != "" {
			_, err := s.clientset.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, s.webhookConfig, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				logger.Info("The webhook certificate Secret and the webhook configuration are gone (an uninstall); not creating the Secret again", "webhookConfiguration", s.webhookConfig)
				return
			}
		}
		if _, err := s.ensure(ctx, meta); err != nil && ctx.Err() == nil {
			logger.Error(err, "Keeping the webhook certificate Secret")
		}
	}
	_, informer := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Secret{},
		Handler: toolscache.ResourceEventHandlerFuncs{
			DeleteFunc: func(obj any) {
				if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				meta := metav1.ObjectMeta{}
				if old, ok := obj.(*corev1.Secret); ok {
					meta = old.ObjectMeta
				}
				recreate(meta)
			},
		},
	})
	go func() {
		// Deleted between the first ensure and this watch: the list
		// finds nothing, and no delete event follows.
		if toolscache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			recreate(metav1.ObjectMeta{})
		}
	}()
	informer.RunWithContext(ctx)
	return nil
}
