package lockgrant

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The webhook's syntax checks and the CRD schema state the same bounds and
// patterns: a schema change that admission does not follow fails here.
func TestSyntaxMatchesSchema(t *testing.T) {
	raw, err := os.ReadFile("../../config/crd/bases/locking.lockwarden.io_lockgrants.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string
				Schema struct {
					OpenAPIV3Schema schema `json:"openAPIV3Schema"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("%d versions, want 1", len(crd.Spec.Versions))
	}
	root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	seen := map[string]bool{}
	for _, r := range specRules {
		path := r.rule.path.String()
		seen[path] = true
		s := root
		for _, part := range strings.Split(path, ".") {
			next, ok := s.Properties[part]
			if !ok {
				t.Fatalf("the schema has no %s", path)
			}
			s = next
		}
		if s.MinLength != r.rule.min || s.MaxLength != r.rule.max {
			t.Errorf("%s: schema length %d..%d, admission %d..%d", path, s.MinLength, s.MaxLength, r.rule.min, r.rule.max)
		}
		want := ""
		if r.rule.re != nil {
			want = r.rule.re.String()
		}
		if s.Pattern != want {
			t.Errorf("%s: schema pattern %q, admission %q", path, s.Pattern, want)
		}
	}
	// Every bounded string in the spec has a rule.
	for name, p := range root.Properties["spec"].Properties {
		walk("spec."+name, p, func(path string, s schema) {
			if s.Type == "string" && (s.MaxLength > 0 || s.MinLength > 0 || s.Pattern != "") && !seen[path] {
				t.Errorf("%s is bounded in the schema but not checked by admission", path)
			}
		})
	}
}

type schema struct {
	Type       string
	MinLength  int `json:"minLength"`
	MaxLength  int `json:"maxLength"`
	Pattern    string
	Properties map[string]schema
}

func walk(path string, s schema, f func(string, schema)) {
	f(path, s)
	for name, p := range s.Properties {
		walk(path+"."+name, p, f)
	}
}
