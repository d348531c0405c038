// Package issuer reads the issuer's state — the FenceIssuer, the signing keys
// in their Secret — and derives from it what the controller needs to issue
// grants and what verifiers need to check them (the trust bundle).
package issuer

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Names of the objects the issuer keeps in the manager's namespace.
const (
	// KeysSecretName holds one Ed25519 private key seed (32 bytes) per
	// listed, non-retired key, under the data key "<keyID>.seed".
	KeysSecretName = "lockwarden-signing-keys"
	// TrustBundleName is the ConfigMap that publishes the trust bundle.
	TrustBundleName = "lockwarden-trust-bundle"
	// TrustBundleKey is the ConfigMap data key of the bundle's JSON.
	TrustBundleKey = "trust-bundle.json"
)

// ErrNotReady means the issuer has no usable signing key yet.
var ErrNotReady = errors.New("issuer: not ready")

// SeedKey is the Secret data key of a key's seed.
func SeedKey(keyID string) string { return keyID + ".seed" }

// Params is what issuing a grant needs right now.
type Params struct {
	// Epoch is the current issuer epoch.
	Epoch int64
	// Revoked are the revoked epochs.
	Revoked []int64
	// KeyID and Key are the Active signing key.
	KeyID string
	Key   ed25519.PrivateKey
}

// Keyring reads the issuer's state through a (cached) reader.
type Keyring struct {
	// Reader reads the FenceIssuer and the keys Secret.
	Reader client.Reader
	// Namespace is the manager's namespace, where the Secret lives.
	Namespace string
}

func (k *Keyring) read(ctx context.Context) (*lockingv1alpha1.FenceIssuer, *corev1.Secret, error) {
	iss := &lockingv1alpha1.FenceIssuer{}
	if err := k.Reader.Get(ctx, types.NamespacedName{Name: lockingv1alpha1.DefaultFenceIssuerName}, iss); err != nil {
		return nil, nil, fmt.Errorf("%w: reading FenceIssuer %q: %w", ErrNotReady, lockingv1alpha1.DefaultFenceIssuerName, err)
	}
	sec := &corev1.Secret{}
	if err := k.Reader.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: KeysSecretName}, sec); err != nil {
		return nil, nil, fmt.Errorf("%w: reading Secret %s/%s: %w", ErrNotReady, k.Namespace, KeysSecretName, err)
	}
	return iss, sec, nil
}

// Params returns the current epoch, revoked epochs and Active signing key.
// It wraps ErrNotReady while the controller has not generated the key yet.
func (k *Keyring) Params(ctx context.Context) (Params, error) {
	iss, sec, err := k.read(ctx)
	if err != nil {
		return Params{}, err
	}
	p := Params{Epoch: iss.Spec.Epoch, Revoked: iss.Spec.RevokedEpochs}
	i := slices.IndexFunc(iss.Spec.SigningKeys, func(s lockingv1alpha1.SigningKey) bool { return s.State == lockingv1alpha1.KeyActive })
	if i < 0 {
		return Params{}, fmt.Errorf("%w: no Active signing key", ErrNotReady)
	}
	p.KeyID = iss.Spec.SigningKeys[i].KeyID
	seed := sec.Data[SeedKey(p.KeyID)]
	if len(seed) != ed25519.SeedSize {
		return Params{}, fmt.Errorf("%w: signing key %q not generated yet", ErrNotReady, p.KeyID)
	}
	p.Key = ed25519.NewKeyFromSeed(seed)
	return p, nil
}

// TrustBundle returns the bundle verifiers use, derived from the same
// FenceIssuer and Secret the controller signs with.
func (k *Keyring) TrustBundle(ctx context.Context) (*fencing.TrustBundle, error) {
	iss, sec, err := k.read(ctx)
	if err != nil {
		return nil, err
	}
	return Bundle(iss, sec), nil
}

// Bundle derives the trust bundle: the public key of every listed key whose
// seed exists (retired keys are listed as retired, without a usable key),
// the current epoch and the revoked epochs.
func Bundle(iss *lockingv1alpha1.FenceIssuer, sec *corev1.Secret) *fencing.TrustBundle {
	b := &fencing.TrustBundle{
		Schema:        fencing.TrustBundleSchema,
		CurrentEpoch:  iss.Spec.Epoch,
		RevokedEpochs: slices.Clone(iss.Spec.RevokedEpochs),
	}
	for _, s := range iss.Spec.SigningKeys {
		seed := sec.Data[SeedKey(s.KeyID)]
		if s.State == lockingv1alpha1.KeyRetired || len(seed) != ed25519.SeedSize {
			continue
		}
		b.Keys = append(b.Keys, fencing.TrustedKey{
			KeyID: s.KeyID, Algorithm: "Ed25519", State: fencing.KeyState(s.State),
			PublicKey: ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey),
		})
	}
	return b
}
