package wiring

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/source/kafka"
	"github.com/prometheus/client_golang/prometheus"
)

func TestHTTPHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := pipeline.NewMetrics(reg)
	kafka.NewMetrics(reg)
	m.CountReload("ok")
	var ready atomic.Bool
	notReady := func() []string {
		if ready.Load() {
			return nil
		}
		return []string{"partition t:3: no batch applied for 1m0s while messages wait"}
	}
	srv := httptest.NewServer(NewHTTPHandler(reg, notReady, false))
	defer srv.Close()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != "not ready\npartition t:3: no batch applied for 1m0s while messages wait\n" {
		t.Errorf("/readyz when not ready = %d %q, want 503 with the reason", code, body)
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz when ready = %d, want 200", code)
	}
	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`cachewarden_rules_reload_total{result="ok"} 1`,
		`# TYPE cachewarden_commit_duration_seconds histogram`,
		`# TYPE cachewarden_apply_retries_total counter`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestHTTPHandlerPprof(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		srv := httptest.NewServer(NewHTTPHandler(prometheus.NewRegistry(), nil, enabled))
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1"} {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := http.StatusNotFound
			if enabled {
				want = http.StatusOK
			}
			if resp.StatusCode != want {
				t.Errorf("pprof %v: GET %s = %d, want %d", enabled, path, resp.StatusCode, want)
			}
		}
		srv.Close()
	}
}
