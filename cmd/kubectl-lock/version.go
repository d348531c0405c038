package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/lockwarden/lockwarden/internal/version"
)

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

// versionString is "kubectl-lockwarden VERSION (revision REVISION,
// GOVERSION)": the version `make build` and the release archives stamp
// into internal/version, as the manager's --version prints it.
func versionString() string {
	return "kubectl-lockwarden " + version.Get().String()
}
