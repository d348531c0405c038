// Command golangci-lint is golangci-lint v2 with two module plugins linked
// in, as `golangci-lint custom` would build it, but from the Go module proxy
// alone: the Kube API Linter (kubeapilinter, for api/) and Kubernetes'
// structured-logging checks (logcheck). Its version is the pinned module's.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/golangci/golangci-lint/v2/pkg/commands"
	"github.com/golangci/golangci-lint/v2/pkg/exitcodes"

	// Module plugins; each registers itself with golangci-lint.
	_ "sigs.k8s.io/kube-api-linter"
	_ "sigs.k8s.io/logtools/logcheck/gclplugin"
)

func main() {
	info := commands.BuildInfo{Version: "unknown", Commit: "?"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info.GoVersion = bi.GoVersion
		for _, m := range bi.Deps {
			if m.Path == "github.com/golangci/golangci-lint/v2" {
				info.Version = strings.TrimPrefix(m.Version, "v") + "+kubeapilinter+logcheck"
			}
		}
	}
	if err := commands.Execute(info); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "The command is terminated due to an error: %v\n", err)
		os.Exit(exitcodes.Failure)
	}
}
