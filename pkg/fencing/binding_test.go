package fencing_test

import (
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckLabelBinding(t *testing.T) {
	const ann = "locking.lockwarden.io/resource"
	valid := func(id string) bool { return id != "" && id != "Bad ID" }
	cases := []struct {
		name                   string
		storedGuarded, guarded bool
		stored, written        string
		resource               string
		want                   fencing.Reason
		detail                 string
	}{
		{"create guarded", false, true, "", "orders", "orders", "", ""},
		{"update keeps its resource", true, true, "orders", "orders", "orders", "", ""},
		{"update changes its resource", true, true, "orders", "invoices", "", fencing.ReasonBindingMismatch,
			"annotation locking.lockwarden.io/resource cannot change while the object is guarded"},
		{"unguarding write is judged by the stored resource", true, false, "orders", "invoices", "orders", "", ""},
		{"delete of a guarded object", true, false, "orders", "", "orders", "", ""},
		{"guarding an object takes the new resource", false, true, "invoices", "orders", "orders", "", ""},
		{"no resource", false, true, "", "", "", fencing.ReasonNoResource,
			`guarded objects need annotation locking.lockwarden.io/resource with a valid resource ID, got ""`},
		{"invalid resource", false, true, "", "Bad ID", "", fencing.ReasonNoResource,
			`guarded objects need annotation locking.lockwarden.io/resource with a valid resource ID, got "Bad ID"`},
		{"stored invalid resource", true, true, "Bad ID", "Bad ID", "", fencing.ReasonNoResource, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := fencing.CheckLabelBinding(c.storedGuarded, c.guarded, c.stored, c.written, ann, valid)
			checkRefusal(t, err, c.want, c.detail)
			if got != c.resource {
				t.Fatalf("resource %q, want %q", got, c.resource)
			}
		})
	}
}
