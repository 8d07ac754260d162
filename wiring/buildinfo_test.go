package wiring

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestBuildInfo(t *testing.T) {
	b := BuildInfo{Version: "v1.4.0-3-gabc", Revision: "abc", GoVersion: "go1.26.0"}
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg, b)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "cachewarden_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v (%v), want the one series cachewarden_build_info", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	var labels []string
	for _, l := range m.GetLabel() {
		labels = append(labels, l.GetName()+"="+l.GetValue())
	}
	if got, want := strings.Join(labels, ","), "goversion=go1.26.0,revision=abc,version=v1.4.0-3-gabc"; got != want || m.GetGauge().GetValue() != 1 {
		t.Errorf("cachewarden_build_info{%s} %v, want {%s} 1", got, m.GetGauge().GetValue(), want)
	}

	rec := httptest.NewRecorder()
	versionHandler(b).ServeHTTP(rec, httptest.NewRequest("GET", "/version", nil))
	var got BuildInfo
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got != b {
		t.Errorf("/version: %s (%v), want %+v", rec.Body.String(), err, b)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("/version content type %q", ct)
	}
}
