package integration

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// clusterWideState are the tests that change state every other test of the
// suite shares: the FenceIssuer's keys and epoch, and fence floors that only
// a raised epoch clears. Any other test that ran after them would be granted
// fences of a later epoch, verify against other keys, or wait behind a
// floor, so they run last (see TestClusterWideState), one after the other
// in this order. Each reads the issuer's epoch as it finds it.
var clusterWideState = []struct {
	name string
	test func(*testing.T)
}{
	{"ExhaustedSequenceNeverCarriesIntoTheEpoch", testExhaustedSequenceNeverCarriesIntoTheEpoch},
	{"GrantNeverIssuedAtOrBelowARecordedFence", testGrantNeverIssuedAtOrBelowARecordedFence},
	{"FloorOfADeletedObjectHoldsNothingBack", testFloorOfADeletedObjectHoldsNothingBack},
	{"SigningKeyRotation", testSigningKeyRotation},
	{"RevokedIssuerEpoch", testRevokedIssuerEpoch},
}

// TestClusterWideState runs the tests of clusterWideState after every other
// test of the suite, one after the other in the order listed. It is the
// suite's only parallel top-level test (TestOnlyClusterWideStateIsParallel
// keeps it so): the testing package starts a parallel top-level test only
// once every sequential one has returned, whatever the files' names or
// -shuffle, and runs nothing beside it. One of them runs alone with
// `go test -run 'TestClusterWideState/SigningKeyRotation'`.
func TestClusterWideState(t *testing.T) {
	t.Parallel()
	for _, tc := range clusterWideState {
		t.Run(tc.name, tc.test)
	}
}

// TestOnlyClusterWideStateIsParallel keeps TestClusterWideState last: a
// second parallel top-level test would run beside it, on the state it
// changes.
func TestOnlyClusterWideStateIsParallel(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestClusterWideState" || fn.Body == nil {
				continue
			}
			for _, stmt := range fn.Body.List {
				if isParallelCall(stmt) {
					t.Errorf("%s: %s calls t.Parallel: it would run beside TestClusterWideState, which changes the FenceIssuer every test shares; make it sequential", fset.Position(fn.Pos()), fn.Name.Name)
				}
			}
		}
	}
}

// isParallelCall reports whether stmt is a call X.Parallel().
func isParallelCall(stmt ast.Stmt) bool {
	es, ok := stmt.(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Parallel" && len(call.Args) == 0
}
