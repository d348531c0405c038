package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// certSync copies the serving certificate from the rotator's Secret into the
// webhook server's certificate directory. In a pod the Secret is mounted
// there; a manager running as a local process (make run, make demo) has no
// mount, so it watches the Secret and writes the files itself.
type certSync struct {
	clientset kubernetes.Interface
	secret    types.NamespacedName
	dir       string
}

var _ manager.Runnable = &certSync{}

// NeedLeaderElection is false: every replica serves webhooks.
func (c *certSync) NeedLeaderElection() bool { return false }

// Start watches the Secret until ctx ends.
func (c *certSync) Start(ctx context.Context) error {
	lw := toolscache.NewListWatchFromClient(c.clientset.CoreV1().RESTClient(), "secrets", c.secret.Namespace,
		fields.OneTermEqualSelector("metadata.name", c.secret.Name))
	write := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			if err := c.write(s); err != nil {
				ctrl.Log.Error(err, "Writing webhook certificate", "dir", c.dir)
			}
		}
	}
	_, informer := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Secret{},
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    write,
			UpdateFunc: func(_, obj any) { write(obj) },
		},
	})
	informer.RunWithContext(ctx)
	return nil
}

// write replaces tls.crt and tls.key when they differ, each by an atomic
// rename so the server never reads half a file.
func (c *certSync) write(s *corev1.Secret) error {
	for _, name := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		data := s.Data[name]
		if len(data) == 0 {
			return nil // not generated yet
		}
		path := filepath.Join(c.dir, name)
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("replacing %s: %w", path, err)
		}
	}
	return nil
}
