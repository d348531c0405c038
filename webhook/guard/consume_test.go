package guard

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// An accepted write's response patch, applied by the API server as RFC
// 6902 says, leaves the object's other annotations, labels and data as
// they were, removes the claim (and a stale Shadow note or override), and
// records the accepted grant, fence and the optional intent, proof and
// write ID: whether the object had annotations or not, and with keys that
// need escaping in a JSON pointer.
func TestConsumePatch(t *testing.T) {
	claim := map[string]string{
		lockingv1alpha1.GrantAnnotation: "billing/g1", lockingv1alpha1.FenceAnnotation: "7",
		lockingv1alpha1.IntentAnnotation: "delete", lockingv1alpha1.WriteIDAnnotation: "w-1",
	}
	stale := map[string]string{
		lockingv1alpha1.AcceptedGrantAnnotation: "billing/g0", lockingv1alpha1.AcceptedFenceAnnotation: "6",
		lockingv1alpha1.AcceptedProofAnnotation: "old-proof", lockingv1alpha1.ShadowDenialAnnotation: "STALE_OWNER",
		"example.com/a~b/c": "kept",
	}
	cases := map[string]struct {
		ann map[string]string
		rec fencing.Accepted
	}{
		"no annotations":          {nil, fencing.Accepted{Grant: "billing/g1", Fence: 7}},
		"claim only":              {claim, fencing.Accepted{Grant: "billing/g1", Fence: 7, Intent: "delete", WriteID: "w-1"}},
		"claim over a record":     {merge(claim, stale), fencing.Accepted{Grant: "billing/g1", Fence: 7, Proof: "proof"}},
		"record already the same": {merge(stale, map[string]string{lockingv1alpha1.AcceptedFenceAnnotation: "7"}), fencing.Accepted{Grant: "billing/g0", Fence: 7}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			obj := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"k": "v"},
				"metadata": map[string]any{"name": "cm", "namespace": "billing", "labels": map[string]any{"l": "1"}}}
			if tc.ann != nil {
				obj["metadata"].(map[string]any)["annotations"] = tc.ann
			}
			raw, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			w, err := decode(request(admissionv1.Update, runtime.RawExtension{}, runtime.RawExtension{Raw: raw}))
			if err != nil {
				t.Fatal(err)
			}
			resp := consume(w.new, tc.rec)
			if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("response %+v, want an allowed JSON patch", resp.AdmissionResponse)
			}
			ops, err := json.Marshal(resp.Patches)
			if err != nil {
				t.Fatal(err)
			}
			patch, err := jsonpatch.DecodePatch(ops)
			if err != nil {
				t.Fatal(err)
			}
			out, err := patch.Apply(raw)
			if err != nil {
				t.Fatalf("applying %s: %v", ops, err)
			}
			var got struct {
				Data     map[string]string `json:"data"`
				Metadata struct {
					Labels, Annotations map[string]string
				} `json:"metadata"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			want := maps.Clone(tc.ann)
			if want == nil {
				want = map[string]string{}
			}
			for _, k := range consumedAnnotations {
				delete(want, k)
			}
			want[lockingv1alpha1.AcceptedGrantAnnotation] = tc.rec.Grant
			want[lockingv1alpha1.AcceptedFenceAnnotation] = fencing.FormatFence(tc.rec.Fence)
			for k, v := range map[string]string{lockingv1alpha1.AcceptedIntentAnnotation: tc.rec.Intent,
				lockingv1alpha1.AcceptedProofAnnotation: string(tc.rec.Proof), lockingv1alpha1.AcceptedWriteIDAnnotation: tc.rec.WriteID} {
				if v == "" {
					delete(want, k)
				} else {
					want[k] = v
				}
			}
			if !maps.Equal(got.Metadata.Annotations, want) || got.Data["k"] != "v" || got.Metadata.Labels["l"] != "1" {
				t.Fatalf("after the patch %s:\nannotations %v\nwant        %v\n(data %v, labels %v)", ops, got.Metadata.Annotations, want, got.Data, got.Metadata.Labels)
			}
			for _, op := range resp.Patches {
				if !strings.HasPrefix(op.Path, "/metadata/annotations") {
					t.Errorf("operation %s %s outside the annotations", op.Operation, op.Path)
				}
			}
		})
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// BenchmarkConsume measures the response to an accepted write of a
// ConfigMap with 4 KiB of data and a claim.
func BenchmarkConsume(b *testing.B) {
	raw, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": map[string]any{"k": strings.Repeat("x", 4096)},
		"metadata": map[string]any{"name": "cm", "namespace": "billing", "annotations": map[string]string{
			lockingv1alpha1.GrantAnnotation: "billing/g1", lockingv1alpha1.FenceAnnotation: "7", "example.com/owner": "team-a"}}})
	if err != nil {
		b.Fatal(err)
	}
	w, err := decode(request(admissionv1.Update, runtime.RawExtension{}, runtime.RawExtension{Raw: raw}))
	if err != nil {
		b.Fatal(err)
	}
	rec := fencing.Accepted{Grant: "billing/g1", Fence: 7}
	b.ReportAllocs()
	for b.Loop() {
		if r := consume(w.new, rec); !r.Allowed {
			b.Fatal(r.Result)
		}
	}
}
