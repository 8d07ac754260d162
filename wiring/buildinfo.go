package wiring

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// BuildInfo identifies the running binary. The command fills it in from
// what the build stamped into the binary; the stack exports it as the
// metric cachewarden_build_info and serves it at /version.
type BuildInfo struct {
	// Version is the release or `git describe` text the build was given,
	// or the module version; "unknown" when the build carried none.
	Version string `json:"version"`
	// Revision is the VCS revision when the build recorded one, else "".
	Revision string `json:"revision,omitempty"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// registerBuildInfo exports b as the gauge cachewarden_build_info, always 1,
// in the manner of Prometheus' own build_info metrics: join it on its
// labels to see which version each instance runs.
func registerBuildInfo(reg prometheus.Registerer, b BuildInfo) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "cachewarden_build_info",
		Help:        "Always 1; its labels name the running binary's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	reg.MustRegister(g)
}

// versionHandler serves b as JSON (GET /version).
func versionHandler(b BuildInfo) http.Handler {
	body, _ := json.Marshal(b) // three strings: cannot fail
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(body, '\n'))
	})
}
