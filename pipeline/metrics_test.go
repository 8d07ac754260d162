package pipeline

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

func TestHTTPHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.events.WithLabelValues("cdc", "debezium", "planned").Add(3)
	m.setLag("cdc", 2, 17)
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
		`cachewarden_events_total{format="debezium",outcome="planned",topic="cdc"} 3`,
		`cachewarden_consumer_lag{partition="2",topic="cdc"} 17`,
		`# TYPE cachewarden_commit_duration_seconds histogram`,
		`# TYPE cachewarden_apply_retries_total counter`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	m.forgetPartition("cdc", 2)
	if _, body := get("/metrics"); strings.Contains(body, "cachewarden_consumer_lag{") {
		t.Errorf("lag of a revoked partition still exported")
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

// TestOutcomeCounts: every op kind and outcome fits the array, and a flush
// adds each pair's count under its labels once, then starts again.
func TestOutcomeCounts(t *testing.T) {
	for k := range 256 {
		if name := rules.OpKind(k).String(); name != "unknown" && k >= 16 {
			t.Errorf("op kind %s is %d, beyond outcomeCounts", name, k)
		}
		if name := cacheops.Outcome(k).String(); !strings.HasPrefix(name, "outcome(") && k >= 16 {
			t.Errorf("outcome %s is %d, beyond outcomeCounts", name, k)
		}
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	var c outcomeCounts
	for _, p := range []struct {
		k rules.OpKind
		o cacheops.Outcome
	}{{rules.OpBump, cacheops.OutcomeIncr}, {rules.OpBump, cacheops.OutcomeAdded}, {rules.OpBump, cacheops.OutcomeIncr},
		{rules.OpSetDelete, cacheops.OutcomeRecountNeeded}, {rules.OpCount, cacheops.OutcomeFailed}} {
		c.add(p.k, p.o)
	}
	c.flush(m.ops)
	c.add(rules.OpBump, cacheops.OutcomeIncr)
	c.flush(m.ops)
	c.flush(m.ops)
	want := map[[2]string]float64{
		{"bump", "incr"}: 3, {"bump", "added"}: 1, {"set_delete", "recount_needed"}: 1, {"count", "failed"}: 1,
	}
	got := map[[2]string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "cachewarden_ops_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			got[[2]string{label(mt, "kind"), label(mt, "outcome")}] = mt.GetCounter().GetValue()
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("cachewarden_ops_total %v, want %v", got, want)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
