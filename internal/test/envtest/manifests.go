package envtest

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Objects decodes a multi-document YAML manifest; empty documents are
// skipped.
func Objects(t testing.TB, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding manifest: %v", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// Find returns the object of kind and name in objs, or fails the test.
func Find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the manifest", kind, name)
	return nil
}

// Kustomize renders the kustomization at dir (relative to root) with
// bin/kubectl.
func Kustomize(t testing.TB, root, dir string) []byte {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), filepath.Join(root, "bin", "kubectl"), "kustomize", filepath.Join(root, dir)).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	return out
}

// Helm runs bin/helm with args in root and returns its standard output.
func Helm(t testing.TB, root string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "bin", "helm"), args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %v: %v\n%s%s\n(bin/helm missing? `make tools` or `hack/build-tools.sh helm` builds it)", args, err, out, stderr.Bytes())
	}
	return out
}
