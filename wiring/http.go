package wiring

import (
	"net/http"
	httppprof "net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewHTTPHandler serves the daemon's operational endpoints:
//
//   - /metrics: the metrics gathered from g, in Prometheus text format;
//   - /healthz: 200 "ok" while the process serves requests;
//   - /readyz: 200 "ready" when ready() reports no reason, else 503
//     "not ready" followed by the reasons, one per line (see
//     Daemon.NotReady);
//   - /debug/pprof/: Go's profiler (net/http/pprof), only when pprof is
//     true.
//
// The handler is safe for concurrent use.
func NewHTTPHandler(g prometheus.Gatherer, ready func() []string, pprof bool) http.Handler {
	mux := http.NewServeMux()
	if pprof {
		mux.HandleFunc("GET /debug/pprof/", httppprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", httppprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", httppprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", httppprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", httppprof.Trace)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var reasons []string
		if ready == nil {
			reasons = []string{"not started"}
		} else {
			reasons = ready()
		}
		if len(reasons) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready\n"))
			for _, r := range reasons {
				w.Write([]byte(r + "\n"))
			}
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}
