package fencing_test

import (
	"errors"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// checkRefusal fails t unless err is a refusal with reason want and, when
// detail is set, exactly that detail; want "" means no refusal.
func checkRefusal(t *testing.T, err error, want fencing.Reason, detail string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return
	}
	var e *fencing.Error
	if !errors.As(err, &e) {
		t.Fatalf("want %s, got %v", want, err)
	}
	if e.Reason != want || !errors.Is(err, want.Sentinel()) {
		t.Fatalf("want %s, got %v", want, err)
	}
	if detail != "" && e.Detail != detail {
		t.Fatalf("detail:\n got %q\nwant %q", e.Detail, detail)
	}
}

func TestCounterRules(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		want   fencing.Reason
		detail string
	}{
		{"named after its resource", fencing.CheckCounterName("orders-1", "orders", "orders-1"), "", ""},
		{"named after another resource", fencing.CheckCounterName("orders-x", "orders", "orders-1"), fencing.ReasonInvalidSpec,
			`the FenceCounter of resource "orders" must be named "orders-1"`},
		{"fence rises", fencing.CheckCounterUpdate(3, 4), "", ""},
		{"fence stays", fencing.CheckCounterUpdate(3, 3), "", ""},
		{"fence falls", fencing.CheckCounterUpdate(3, 2), fencing.ReasonFenceRegression, "fence may never decrease (3 -> 2)"},
		{"delete with its namespace", fencing.CheckCounterDelete(true, "orders"), "", ""},
		{"delete alone", fencing.CheckCounterDelete(false, "orders"), fencing.ReasonCounterProtected,
			`the fence record of resource "orders" is kept as long as its namespace: a new one would reissue fences from 1`},
		{"delete the issuer", fencing.CheckIssuerDelete(), fencing.ReasonCounterProtected,
			"deleting the issuer would restart epochs at 0 and forget revoked epochs and retired keys; change it instead"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkRefusal(t, c.err, c.want, c.detail) })
	}
}
