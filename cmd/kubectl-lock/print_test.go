package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/utils/ptr"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Fences a float64 cannot hold: the first integer above 2^53 that it
// rounds, and the last fence a resource can issue.
const (
	fenceAbove2p53 int64 = 1<<53 + 1
	fenceMax       int64 = math.MaxInt64
)

// Every -o format of acquire, list and status prints fences (and every
// other integer) exactly, as kubectl get does: a user passes the printed
// fence to a guarded write, which refuses any other number.
func TestOutputFormatsPrintFencesExactly(t *testing.T) {
	g1 := grantAt("g-above", "db/orders", 1, 0, lockingv1alpha1.PhaseHeld, ptr.To[int32](0), fenceAbove2p53)
	g2 := grantAt("g-max", "render/farm", 2, 4, lockingv1alpha1.PhaseHeld, ptr.To[int32](3), fenceMax)
	g2.Status.ObservedRenewals = fenceMax
	st := statusOf("ns", "render/farm", []lockingv1alpha1.LockGrant{
		grantAt("h0", "render/farm", 1, 2, lockingv1alpha1.PhaseHeld, ptr.To[int32](0), fenceAbove2p53),
		grantAt("h1", "render/farm", 2, 2, lockingv1alpha1.PhaseHeld, ptr.To[int32](1), fenceMax),
	}, &lockingv1alpha1.FenceCounter{Spec: lockingv1alpha1.FenceCounterSpec{Fence: fenceMax}})
	st.addSlotFences(nil)

	above, maxed := strconv.FormatInt(fenceAbove2p53, 10), strconv.FormatInt(fenceMax, 10)
	for _, tc := range []struct {
		command  string
		withName bool
		// print prints the command's object with p, as the command does;
		// byName is -o name.
		print func(p printers.ResourcePrinter, byName bool, w *bytes.Buffer) error
		// jsonpath and template print the fences; want is what they print.
		jsonpath, template, want string
		// names is what -o name prints.
		names string
	}{{
		command: "acquire", withName: true,
		print: func(p printers.ResourcePrinter, _ bool, w *bytes.Buffer) error {
			return printObject(p, &g1, "LockGrant", w)
		},
		jsonpath: "{.metadata.name} {.status.fenceToken}",
		template: "{{.metadata.name}} {{.status.fenceToken}}",
		want:     "g-above " + above,
		names:    "lockgrant.locking.lockwarden.io/g-above\n",
	}, {
		command: "acquire at the fence limit", withName: true,
		print: func(p printers.ResourcePrinter, _ bool, w *bytes.Buffer) error {
			return printObject(p, &g2, "LockGrant", w)
		},
		jsonpath: "{.status.fenceToken} {.status.observedRenewals}",
		template: "{{.status.fenceToken}} {{.status.observedRenewals}}",
		want:     maxed + " " + maxed,
		names:    "lockgrant.locking.lockwarden.io/g-max\n",
	}, {
		command: "list", withName: true,
		print: func(p printers.ResourcePrinter, byName bool, w *bytes.Buffer) error {
			return printGrants(p, byName, &lockingv1alpha1.LockGrantList{Items: []lockingv1alpha1.LockGrant{g1, g2}}, w)
		},
		jsonpath: `{range .items[*]}{.metadata.name} {.status.fenceToken}{"\n"}{end}`,
		template: `{{range .items}}{{.metadata.name}} {{.status.fenceToken}}{{"\n"}}{{end}}`,
		want:     "g-above " + above + "\ng-max " + maxed + "\n",
		names:    "lockgrant.locking.lockwarden.io/g-above\nlockgrant.locking.lockwarden.io/g-max\n",
	}, {
		command: "status",
		print: func(p printers.ResourcePrinter, _ bool, w *bytes.Buffer) error {
			return printObject(p, st, "ResourceStatus", w)
		},
		jsonpath: `{.holder.fence} {.highestFence}{range .holders[*]} {.fence}{end}{range .slotFences[*]} {.highestFence}{end}`,
		template: `{{.holder.fence}} {{.highestFence}}{{range .holders}} {{.fence}}{{end}}{{range .slotFences}} {{.highestFence}}{{end}}`,
		want:     strings.Join([]string{above, maxed, above, maxed, maxed, maxed}, " "),
	}} {
		formats := printFlags(tc.withName).AllowedFormats()
		if !tc.withName && strings.Contains(strings.Join(formats, " "), "name") {
			t.Errorf("%s accepts -o name: %v", tc.command, formats)
		}
		for _, format := range formats {
			t.Run(tc.command+"/"+format, func(t *testing.T) {
				args := []string{"-o", format}
				exact := ""
				switch {
				case strings.HasPrefix(format, "jsonpath"):
					args = append(args, "--template", templateArg(t, format, tc.jsonpath))
					if format != "jsonpath-as-json" {
						exact = tc.want
					}
				case strings.Contains(format, "template"):
					args = append(args, "--template", templateArg(t, format, tc.template))
					exact = tc.want
				case format == "name":
					exact = tc.names
				}
				pf := printFlags(tc.withName)
				cmd := &cobra.Command{}
				pf.AddFlags(cmd)
				if err := cmd.ParseFlags(args); err != nil {
					t.Fatal(err)
				}
				p, err := toPrinter(pf)
				if err != nil || p == nil {
					t.Fatalf("-o %s: printer %v, %v", format, p, err)
				}
				var out bytes.Buffer
				if err := tc.print(p, format == "name", &out); err != nil {
					t.Fatalf("-o %s: %v", format, err)
				}
				got := out.String()
				switch {
				case exact != "":
					if got != exact {
						t.Errorf("-o %s printed %q, want %q", format, got, exact)
					}
				default:
					for _, fence := range strings.Fields(tc.want) {
						if !strings.Contains(got, fence) {
							t.Errorf("-o %s does not print fence %s exactly:\n%s", format, fence, got)
						}
					}
				}
				if strings.Contains(got, "e+") {
					t.Errorf("-o %s prints a number as a float:\n%s", format, got)
				}
			})
		}
	}
}

// templateArg is tmpl, or for a -file format a file holding it.
func templateArg(t *testing.T, format, tmpl string) string {
	t.Helper()
	if !strings.HasSuffix(format, "file") {
		return tmpl
	}
	path := filepath.Join(t.TempDir(), "template")
	if err := os.WriteFile(path, []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
