package recovery

import (
	"context"
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

type kinds []*metav1.APIResourceList

func (k kinds) ServerPreferredResources() ([]*metav1.APIResourceList, error) {
	return k, &discovery.ErrGroupDiscoveryFailed{Groups: map[schema.GroupVersion]error{{Group: "broken.example.com", Version: "v1"}: errors.New("unavailable")}}
}

func obj(apiVersion, kind, ns, name string, labels, annotations map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: apiVersion, Kind: kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
	}
}

func fence(e, s int64) int64 { return e<<fencing.EpochBits | s }

// Every object that carries an accepted fence counts, of any kind, when
// guarded now by the label or an Enforce policy, or, no longer guarded,
// when its proof verifies; attributed to the resource its proof, its
// annotation or its policy names; an overridden record and a malformed
// fence do not count, nor a record on an object anyone may annotate that
// the issuer did not sign; a kind that cannot be listed is named, and the
// rest is still scanned.
func TestScanFindsRecordedFences(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle := &fencing.TrustBundle{Schema: fencing.TrustBundleSchema, Keys: []fencing.TrustedKey{{KeyID: "k1", Algorithm: "Ed25519", PublicKey: pub, State: fencing.KeyActive}}}
	proof := fencing.Sign(fencing.Record{Namespace: "billing", Resource: lockingv1alpha1.SlotResource("batch", 2), Fence: fence(3, 9), IssuerEpoch: 3, KeyID: "k1"}, key)
	unsigned := fencing.FormatProof(fencing.Record{Namespace: "billing", Resource: lockingv1alpha1.SlotResource("batch", 1), Fence: fence(9, 9), IssuerEpoch: 9, KeyID: "k1"}, make([]byte, 64))
	accepted := func(f int64, extra ...string) map[string]string {
		a := map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: fencing.FormatFence(f)}
		for i := 0; i+1 < len(extra); i += 2 {
			a[extra[i]] = extra[i+1]
		}
		return a
	}
	pol := &lockingv1alpha1.GuardPolicy{ObjectMeta: metav1.ObjectMeta{Name: "ledgers"}, Spec: lockingv1alpha1.GuardPolicySpec{
		Resources:          []lockingv1alpha1.GuardedResource{{APIGroup: "apps", Resource: "deployments"}},
		ResourceIDTemplate: "settlement/{namespace}/{name}", Mode: lockingv1alpha1.ModeEnforce,
	}}
	shadow := &lockingv1alpha1.GuardPolicy{ObjectMeta: metav1.ObjectMeta{Name: "shadowed"}, Spec: lockingv1alpha1.GuardPolicySpec{
		Resources:          []lockingv1alpha1.GuardedResource{{APIGroup: "batch", Resource: "jobs"}},
		ResourceIDTemplate: "settlement/{namespace}/{name}", Mode: lockingv1alpha1.ModeShadow,
	}}
	guarded := map[string]string{lockingv1alpha1.GuardedLabel: "true"}
	objs := []runtime.Object{
		obj("v1", "ConfigMap", "billing", "labeled", map[string]string{lockingv1alpha1.GuardedLabel: "true"},
			accepted(fence(3, 5), lockingv1alpha1.ResourceAnnotation, "ledger", lockingv1alpha1.AcceptedGrantAnnotation, "billing/g1")),
		obj("v1", "ConfigMap", "billing", "proven", nil,
			accepted(fence(3, 9), lockingv1alpha1.AcceptedProofAnnotation, string(proof))),
		obj("v1", "ConfigMap", "billing", "retired", nil,
			accepted(fence(9, 1), lockingv1alpha1.ResourceAnnotation, "ledger", lockingv1alpha1.AcceptedIntentAnnotation, fencing.IntentOverride)),
		obj("v1", "ConfigMap", "billing", "mangled", nil, accepted(0, lockingv1alpha1.AcceptedFenceAnnotation, "12a")),
		obj("v1", "ConfigMap", "billing", "plain", nil, nil),
		obj("apps/v1", "Deployment", "billing", "ledger-7", nil, accepted(fence(4, 2))),
		obj("v1", "Namespace", "", "orphan", guarded, accepted(fence(5, 1))),
		// What anyone allowed to annotate an object can write counts for
		// nothing: a record on an object not guarded now whose proof
		// does not verify, names another fence, or is missing; values
		// admission never writes; a Shadow policy's object.
		obj("v1", "ConfigMap", "billing", "forged", nil,
			accepted(fence(9, 9), lockingv1alpha1.ResourceAnnotation, "ledger", lockingv1alpha1.AcceptedGrantAnnotation, "billing/g1")),
		obj("v1", "ConfigMap", "mallory", "forged-elsewhere", map[string]string{lockingv1alpha1.GuardedLabel: "false"},
			accepted(fence(9, 9), lockingv1alpha1.ResourceAnnotation, "ledger", lockingv1alpha1.AcceptedGrantAnnotation, "billing/g1")),
		obj("v1", "ConfigMap", "billing", "unsigned", nil, accepted(fence(9, 9), lockingv1alpha1.AcceptedProofAnnotation, string(unsigned))),
		obj("v1", "ConfigMap", "billing", "signed-other-fence", nil, accepted(fence(9, 9), lockingv1alpha1.AcceptedProofAnnotation, string(proof))),
		obj("v1", "ConfigMap", "billing", "huge", guarded, map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: "9223372036854775808", lockingv1alpha1.ResourceAnnotation: "ledger"}),
		obj("v1", "ConfigMap", "billing", "negative", guarded, map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: "-5", lockingv1alpha1.ResourceAnnotation: "ledger"}),
		obj("v1", "ConfigMap", "billing", "hex", guarded, map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: "0x7fffffffffffffff", lockingv1alpha1.ResourceAnnotation: "ledger"}),
		obj("v1", "ConfigMap", "billing", "padded", guarded, map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: "0009", lockingv1alpha1.ResourceAnnotation: "ledger"}),
		obj("batch/v1", "Job", "billing", "shadowed-7", nil, accepted(fence(9, 9))),
		// The guarded-write webhooks skip kube-system: a label there
		// guards nothing.
		obj("v1", "ConfigMap", "kube-system", "labeled-unchecked", guarded,
			accepted(fence(9, 9), lockingv1alpha1.ResourceAnnotation, "ledger", lockingv1alpha1.AcceptedGrantAnnotation, "billing/g1")),
	}
	mdScheme := metadatafake.NewTestScheme()
	metav1.AddMetaToScheme(mdScheme)
	md := metadatafake.NewSimpleMetadataClient(mdScheme, objs...)
	md.PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("no"))
	})
	s := &Scanner{
		Discovery: kinds{
			{GroupVersion: "v1", APIResources: []metav1.APIResource{
				{Name: "configmaps", Kind: "ConfigMap", Namespaced: true, Verbs: []string{"get", "list"}},
				{Name: "secrets", Kind: "Secret", Namespaced: true, Verbs: []string{"get", "list"}},
				{Name: "namespaces", Kind: "Namespace", Verbs: []string{"get", "list"}},
				{Name: "pods/status", Kind: "Pod", Namespaced: true, Verbs: []string{"get", "list"}},
				{Name: "bindings", Kind: "Binding", Namespaced: true, Verbs: []string{"create"}},
			}},
			{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "deployments", Kind: "Deployment", Namespaced: true, Verbs: []string{"list"}}}},
			{GroupVersion: "batch/v1", APIResources: []metav1.APIResource{{Name: "jobs", Kind: "Job", Namespaced: true, Verbs: []string{"list"}}}},
		},
		Metadata:  md,
		Bundle:    func(context.Context) (*fencing.TrustBundle, error) { return bundle, nil },
		Unguarded: []string{"kube-system", "lockwarden-system"},
		Log:       logr.Discard(),
	}
	scheme := runtime.NewScheme()
	if err := lockingv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	s.Policies = fake.NewClientBuilder().WithScheme(scheme).WithObjects(pol, shadow).Build()
	f, err := s.Scan(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := f.For("billing", "ledger"); len(got) != 1 || got["ledger"].Fence != fence(3, 5) || got["ledger"].Where != "ConfigMap billing/labeled" {
		t.Errorf("floors of ledger = %+v; want fence %d on ConfigMap billing/labeled (the override not counted)", got, fence(3, 5))
	}
	if got := f.For("billing", "batch"); len(got) != 1 || got[lockingv1alpha1.SlotResource("batch", 2)].Fence != fence(3, 9) {
		t.Errorf("floors of batch = %+v; want slot 2 at %d, from the signed proof, and nothing from the unsigned one", got, fence(3, 9))
	}
	if got := f.For("billing", "settlement/billing/shadowed-7"); len(got) != 0 {
		t.Errorf("floors of a Shadow policy's object = %+v; want none", got)
	}
	if got := f.For("billing", "settlement/billing/ledger-7"); got["settlement/billing/ledger-7"].Fence != fence(4, 2) {
		t.Errorf("floors of the policy's object = %+v; want %d", got, fence(4, 2))
	}
	if f.Highest.Fence != fence(5, 1) || f.Highest.Where != "Namespace orphan" || f.Unattributed != 1 || f.Records != 4 {
		t.Errorf("highest %+v, %d records, %d unattributed; want %d on Namespace orphan, 4 records, 1 unattributed", f.Highest, f.Records, f.Unattributed, fence(5, 1))
	}
	if len(f.Unreadable) != 2 {
		t.Errorf("unreadable = %q; want the broken group and secrets", f.Unreadable)
	}

	// Floors only rise: a scan that no longer sees a record keeps it.
	if err := md.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "billing", "labeled"); err != nil {
		t.Fatal(err)
	}
	f, err = s.Scan(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := f.For("billing", "ledger")["ledger"].Fence; got != fence(3, 5) {
		t.Errorf("after the object was deleted, the floor of ledger = %d; want it kept, %d", got, fence(3, 5))
	}
	if s.Floors("billing", "nothing") != nil {
		t.Error("a resource without records has floors")
	}

	// Confirmed, a floor whose object is gone holds nothing back any more.
	if fl, err := s.Confirm(t.Context(), "billing", "ledger", "ledger"); err != nil || fl.Fence != 0 {
		t.Fatalf("Confirm of the deleted object's floor = %+v, %v; want none", fl, err)
	}
	if got := s.Floors("billing", "ledger"); got["ledger"].Fence != 0 {
		t.Errorf("floors of ledger after the confirm = %+v; want none", got)
	}
	// One whose object now records a lower fence (restored with etcd)
	// counts with that fence; one whose object records the same stays.
	gvr := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	restored := obj("apps/v1", "Deployment", "billing", "ledger-7", nil, accepted(fence(4, 1)))
	if err := md.Tracker().Update(gvr, restored, "billing"); err != nil {
		t.Fatal(err)
	}
	if fl, err := s.Confirm(t.Context(), "billing", "settlement/billing/ledger-7", "settlement/billing/ledger-7"); err != nil || fl.Fence != fence(4, 1) || fl.Where != "Deployment billing/ledger-7" {
		t.Fatalf("Confirm of the restored object's floor = %+v, %v; want %d on Deployment billing/ledger-7", fl, err, fence(4, 1))
	}
	if fl, err := s.Confirm(t.Context(), "billing", "batch", lockingv1alpha1.SlotResource("batch", 2)); err != nil || fl.Fence != fence(3, 9) {
		t.Fatalf("Confirm of an unchanged floor = %+v, %v; want %d", fl, err, fence(3, 9))
	}
}
