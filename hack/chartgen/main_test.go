package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestChartMatchesConfig fails when the chart's generated templates differ
// from what config/ gives today: someone changed the CRDs, RBAC, webhooks
// or alerts in config/ without running `make chart`.
func TestChartMatchesConfig(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	committed := filepath.Join(root, "charts", "lockwarden", "templates", "generated")
	fresh := t.TempDir()
	if err := run(root, fresh); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(fresh)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		want, err := os.ReadFile(filepath.Join(fresh, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(committed, e.Name()))
		if err != nil {
			t.Errorf("charts/lockwarden/templates/generated/%s: %v; run `make chart`", e.Name(), err)
			continue
		}
		if string(got) != string(want) {
			t.Errorf("charts/lockwarden/templates/generated/%s is out of date with config/; run `make chart` and commit the result", e.Name())
		}
	}
	committedEntries, err := os.ReadDir(committed)
	if err != nil {
		t.Fatal(err)
	}
	if len(committedEntries) != len(entries) {
		t.Errorf("charts/lockwarden/templates/generated has %d files, chartgen writes %d; run `make chart`", len(committedEntries), len(entries))
	}
}
