// Package version says which build of servercount is running: the
// version, the commit and the Go version, for --version and for the
// servercount_build_info metric.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Set by the Makefile with -ldflags "-X ...", from git describe and git
// rev-parse; empty in a plain go build, where the module's build
// information answers instead.
var (
	version  string
	revision string
)

// Info describes a build.
type Info struct {
	// Version is a release tag such as v0.2.0, a git describe such as
	// v0.2.0-3-gabc1234, the module version of a go install, or "devel".
	Version string
	// Revision is the commit, with "-dirty" when built from a modified
	// tree; empty when unknown.
	Revision string
	// GoVersion is the Go release that built the binary.
	GoVersion string
}

// Get returns the running binary's build information.
func Get() Info {
	info := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return orDevel(info)
	}
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if info.Revision == "" {
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && info.Revision != "" {
			info.Revision += "-dirty"
		}
	}
	return orDevel(info)
}

func orDevel(i Info) Info {
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// String is the line --version prints.
func (i Info) String() string {
	rev := i.Revision
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("%s (commit %s, %s, %s/%s)", i.Version, rev, i.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// Collector returns the servercount_build_info gauge: always 1, labelled
// with the build, as Kubernetes components export kubernetes_build_info.
func (i Info) Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "servercount", Name: "build_info",
		Help:        "A metric with a constant '1' value labelled by the version, revision and Go version of the running binary.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	return g
}
