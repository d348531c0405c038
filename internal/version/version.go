// Package version says which build of lockwarden is running. Release builds
// set Version and Revision with -ldflags "-X"; other builds fall back to
// what the Go toolchain recorded (the module version and the VCS revision),
// or "dev".
package version

import (
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at link time, e.g.
//
//	go build -ldflags "-X github.com/lockwarden/lockwarden/internal/version.Version=v0.1.0"
var (
	// Version is the release, e.g. v0.1.0.
	Version = ""
	// Revision is the source commit.
	Revision = ""
)

// Info is one build's identity.
type Info struct {
	Version, Revision, GoVersion string
}

var get = sync.OnceValue(func() Info {
	i := Info{Version: Version, Revision: Revision, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && i.Revision == "" {
				i.Revision = s.Value
			}
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Revision == "" {
		i.Revision = "unknown"
	}
	return i
})

// Get returns this binary's build information.
func Get() Info { return get() }

// String is the one-line form `--version` prints.
func (i Info) String() string {
	return i.Version + " (revision " + i.Revision + ", " + i.GoVersion + ")"
}

// BuildInfo is the gauge lockwarden_build_info{version,revision,goversion},
// always 1, as Prometheus' own *_build_info metrics are. Register it once.
func BuildInfo() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockwarden_build_info",
		Help: "The running lockwarden build: always 1, with its version, source revision and Go version as labels.",
		ConstLabels: prometheus.Labels{
			"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion,
		},
	})
	g.Set(1)
	return g
}
