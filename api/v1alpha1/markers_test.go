package v1alpha1

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
)

// schemaOf returns the OpenAPI schema of a generated CRD.
func schemaOf(t *testing.T, plural string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("../../config/crd/bases/locking.lockwarden.io_" + plural + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	versions := crd["spec"].(map[string]any)["versions"].([]any)
	if len(versions) != 1 {
		t.Fatalf("%s: %d versions, want 1", plural, len(versions))
	}
	return versions[0].(map[string]any)["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
}

// field walks a schema along a dotted path of properties; "[]" steps into
// an array's items.
func field(t *testing.T, s map[string]any, path string) map[string]any {
	t.Helper()
	for _, part := range strings.Split(path, ".") {
		var next any
		if part == "[]" {
			next = s["items"]
		} else {
			props, _ := s["properties"].(map[string]any)
			next = props[part]
		}
		m, ok := next.(map[string]any)
		if !ok {
			t.Fatalf("the schema has no %s", path)
		}
		s = m
	}
	return s
}

// The constants of this package are the markers' words: the CRD schemas
// that controller-gen writes from the markers state the same patterns,
// bounds and phases.
func TestMarkersMatchConstants(t *testing.T) {
	grants := schemaOf(t, "lockgrants")
	for _, tc := range []struct {
		schema  map[string]any
		path    string
		pattern string
		max     int
	}{
		{grants, "spec.resource", ResourcePattern, MaxResourceLength},
		{grants, "spec.requestID", RequestIDPattern, MaxRequestIDLength},
		{grants, "spec.operationRoot", OperationRootPattern, 0},
		{grants, "spec.operationClass", OperationClassPattern, MaxOperationClassLength},
		{schemaOf(t, "fenceissuers"), "spec.signingKeys.[].keyID", SigningKeyIDPattern, MaxSigningKeyIDLength},
		{schemaOf(t, "guardpolicies"), "spec.resources.[].resource", GuardedResourcePattern, 0},
	} {
		f := field(t, tc.schema, tc.path)
		if got, _ := f["pattern"].(string); got != tc.pattern {
			t.Errorf("%s: schema pattern %q, constant %q", tc.path, got, tc.pattern)
		}
		if got := fmt.Sprint(f["maxLength"]); tc.max != 0 && got != fmt.Sprint(tc.max) {
			t.Errorf("%s: schema maxLength %s, constant %d", tc.path, got, tc.max)
		}
	}

	var want []string
	for _, p := range LockGrantPhases() {
		want = append(want, string(p))
	}
	for _, tc := range []struct {
		schema map[string]any
		path   string
	}{
		{grants, "status.phase"},
		{schemaOf(t, "requestidledgers"), "spec.entries.[].phase"},
	} {
		var got []string
		for _, v := range field(t, tc.schema, tc.path)["enum"].([]any) {
			got = append(got, v.(string))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: schema enum %v, LockGrantPhases %v", tc.path, got, want)
		}
	}

	// The status rules that keep a final phase final list the final
	// phases.
	var final []string
	for _, p := range LockGrantPhases() {
		if p.Final() {
			final = append(final, "'"+string(p)+"'")
		}
	}
	list := regexp.MustCompile(`oldSelf\.phase in \[([^\]]*)\]`)
	rules := 0
	for _, r := range field(t, grants, "status")["x-kubernetes-validations"].([]any) {
		for _, m := range list.FindAllStringSubmatch(r.(map[string]any)["rule"].(string), -1) {
			rules++
			if got := strings.Split(m[1], ", "); !slices.Equal(got, final) {
				t.Errorf("status rule lists final phases %v, want %v", got, final)
			}
		}
	}
	if rules == 0 {
		t.Error("no status rule lists the final phases")
	}
}

func TestValidSpecFields(t *testing.T) {
	for _, tc := range []struct {
		valid func(string) bool
		in    string
		want  bool
	}{
		{ValidRequestID, "run-2026.07_19", true},
		{ValidRequestID, strings.Repeat("a", MaxRequestIDLength), true},
		{ValidRequestID, strings.Repeat("a", MaxRequestIDLength+1), false},
		{ValidRequestID, "", false},
		{ValidRequestID, "-a", false},
		{ValidOperationRoot, "sha256:" + strings.Repeat("0f", 32), true},
		{ValidOperationRoot, "sha256:" + strings.Repeat("0F", 32), false},
		{ValidOperationClass, "settlement", true},
		{ValidOperationClass, strings.Repeat("a", MaxOperationClassLength+1), false},
		{ValidOperationClass, "Settlement", false},
	} {
		if got := tc.valid(tc.in); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.in, got, tc.want)
		}
	}
}
