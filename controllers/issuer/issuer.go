// Package issuer is the FenceIssuer controller: it keeps one private key per
// listed signing key in the Secret lockwarden-signing-keys (generating new
// keys, deleting retired ones) and publishes the public trust bundle in the
// ConfigMap lockwarden-trust-bundle, both in the manager's namespace. It
// creates the FenceIssuer "default" (epoch 0, one Active key) when missing.
package issuer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	issuerkeys "github.com/lockwarden/lockwarden/internal/issuer"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=fenceissuers,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=locking.lockwarden.io,resources=fenceissuers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",namespace=lockwarden-system,resources=secrets;configmaps,verbs=get;list;watch;create;update;patch

// Reconciler maintains the issuer's keys and trust bundle.
type Reconciler struct {
	Client client.Client
	// Namespace is the manager's namespace.
	Namespace string
}

var defaultKey = types.NamespacedName{Name: lockingv1alpha1.DefaultFenceIssuerName}

// SetupWithManager registers the controller, and a start-up step that
// creates the default FenceIssuer when there is none.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Namespace && (o.GetName() == issuerkeys.KeysSecretName || o.GetName() == issuerkeys.TrustBundleName)
	})
	toDefault := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: defaultKey}}
	})
	if err := mgr.Add(manager.RunnableFunc(r.ensureDefault)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("fenceissuer").
		For(&lockingv1alpha1.FenceIssuer{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Secret{}, toDefault, builder.WithPredicates(inNamespace)).
		Watches(&corev1.ConfigMap{}, toDefault, builder.WithPredicates(inNamespace)).
		Complete(r)
}

// ensureDefault creates FenceIssuer "default" (epoch 0, key k1 Active) if
// none exists. It runs once, on the leader.
func (r *Reconciler) ensureDefault(ctx context.Context) error {
	iss := &lockingv1alpha1.FenceIssuer{
		ObjectMeta: metav1.ObjectMeta{Name: defaultKey.Name},
		Spec: lockingv1alpha1.FenceIssuerSpec{
			SigningKeys: []lockingv1alpha1.SigningKey{{KeyID: "k1", State: lockingv1alpha1.KeyActive}},
		},
	}
	if err := r.Client.Create(ctx, iss); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating FenceIssuer %q: %w", defaultKey.Name, err)
	}
	return nil
}

// Reconcile generates and deletes key material, publishes the trust
// bundle, and reports Ready.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.NamespacedName != defaultKey {
		return reconcile.Result{}, nil
	}
	iss := &lockingv1alpha1.FenceIssuer{}
	if err := r.Client.Get(ctx, defaultKey, iss); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	sec, err := r.syncKeys(ctx, iss)
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := r.publish(ctx, issuerkeys.Bundle(iss, sec)); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.setReady(ctx, iss)
}

// syncKeys makes the Secret hold a seed for exactly the non-retired keys.
func (r *Reconciler) syncKeys(ctx context.Context, iss *lockingv1alpha1.FenceIssuer) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	key := types.NamespacedName{Namespace: r.Namespace, Name: issuerkeys.KeysSecretName}
	err := r.Client.Get(ctx, key, sec)
	create := apierrors.IsNotFound(err)
	if err != nil && !create {
		return nil, fmt.Errorf("reading signing keys: %w", err)
	}
	if create {
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Type: corev1.SecretTypeOpaque}
	}
	want := map[string][]byte{}
	for _, k := range iss.Spec.SigningKeys {
		if k.State == lockingv1alpha1.KeyRetired {
			continue // its private key is destroyed
		}
		seed := sec.Data[issuerkeys.SeedKey(k.KeyID)]
		if len(seed) != ed25519.SeedSize {
			_, priv, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return nil, err
			}
			seed = priv.Seed()
		}
		want[issuerkeys.SeedKey(k.KeyID)] = seed
	}
	if !create && sameData(sec.Data, want) {
		return sec, nil
	}
	sec.Data = want
	if create {
		err = r.Client.Create(ctx, sec)
	} else {
		err = r.Client.Update(ctx, sec)
	}
	if err != nil {
		return nil, fmt.Errorf("writing signing keys: %w", err)
	}
	return sec, nil
}

// publish writes the trust bundle ConfigMap when it differs.
func (r *Reconciler) publish(ctx context.Context, b *fencing.TrustBundle) error {
	data, err := b.Marshal()
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: r.Namespace, Name: issuerkeys.TrustBundleName}
	switch err := r.Client.Get(ctx, key, cm); {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Data: map[string]string{issuerkeys.TrustBundleKey: string(data)}}
		return r.Client.Create(ctx, cm)
	case err != nil:
		return fmt.Errorf("reading trust bundle: %w", err)
	}
	if cm.Data[issuerkeys.TrustBundleKey] == string(data) {
		return nil
	}
	cm.Data = map[string]string{issuerkeys.TrustBundleKey: string(data)}
	return r.Client.Update(ctx, cm)
}

func (r *Reconciler) setReady(ctx context.Context, iss *lockingv1alpha1.FenceIssuer) error {
	before := iss.Status.DeepCopy()
	iss.Status.ObservedGeneration = iss.Generation
	iss.Status.TrustBundle = r.Namespace + "/" + issuerkeys.TrustBundleName
	meta.SetStatusCondition(&iss.Status.Conditions, metav1.Condition{
		Type: lockingv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: lockingv1alpha1.FenceIssuerReasonPublished, ObservedGeneration: iss.Generation,
		Message: fmt.Sprintf("Epoch %d; trust bundle published in %s", iss.Spec.Epoch, iss.Status.TrustBundle),
	})
	if equalStatus(before, &iss.Status) {
		return nil
	}
	return r.Client.Status().Update(ctx, iss)
}

func equalStatus(a, b *lockingv1alpha1.FenceIssuerStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.TrustBundle != b.TrustBundle || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message || x.ObservedGeneration != y.ObservedGeneration {
			return false
		}
	}
	return true
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
