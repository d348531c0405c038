package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with
// -ldflags "-X main.version=v0.3.0"; otherwise the module's version.
var version = ""

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintln(a.streams.Out, versionString())
			return nil
		},
	}
}

// versionString is "kubectl-lock VERSION (commit REVISION, GOVERSION)",
// from the build's own record (debug.ReadBuildInfo).
func versionString() string {
	v, rev := version, "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				rev = s.Value
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	return fmt.Sprintf("kubectl-lock %s (commit %s, %s)", v, rev, runtime.Version())
}
