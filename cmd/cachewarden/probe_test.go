package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestProbe asks a running daemon that cannot reach Kafka: /readyz fails
// (exit status 1, the reasons printed), /healthz and /version answer
// (exit status 0), by --addr and by the http.listen of a config file; a
// daemon that is not there fails.
func TestProbe(t *testing.T) {
	mc := testsvc.Memcached(t)
	topic := "cdc-" + testsvc.Unique()
	d := startDaemon(t, writeCountConfig(t, []string{closedAddr(t)}, topic, mc, testsvc.MySQLDSN(t)))

	out, errOut, err := invoke(t, "", "probe", "--addr", d.addr)
	if code := exitCode(err); code != 1 || !strings.Contains(errOut, "503 Service Unavailable") || !strings.Contains(errOut, "not ready") {
		t.Errorf("probe /readyz of a daemon without Kafka: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, err = invoke(t, "", "probe", "--addr", d.addr, "--path", "/healthz")
	if err != nil || out != "ok\n" {
		t.Errorf("probe /healthz: %v, stdout %q, stderr %q", err, out, errOut)
	}

	cfg := filepath.Join(t.TempDir(), "probe.yaml")
	data, err := os.ReadFile(writeCountConfig(t, []string{closedAddr(t)}, topic, mc, testsvc.MySQLDSN(t)))
	if err != nil {
		t.Fatal(err)
	}
	data = regexp.MustCompile(`listen: .*`).ReplaceAll(data, []byte(`listen: "`+d.addr+`"`))
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = invoke(t, "", "probe", "-c", cfg, "--path", "/version")
	if err != nil || !strings.Contains(out, `"version":`) {
		t.Errorf("probe -c /version: %v, stdout %q, stderr %q", err, out, errOut)
	}

	if _, errOut, err := invoke(t, "", "probe", "--addr", closedAddr(t)); exitCode(err) != 1 || !strings.Contains(err.Error()+errOut, "connection refused") {
		t.Errorf("probe of nothing: %v, stderr %q", err, errOut)
	}
	if _, _, err := invoke(t, "", "probe", "--path", "readyz"); exitCode(err) != 2 {
		t.Errorf("probe --path readyz: %v, want a usage error", err)
	}
}

func TestProbeTarget(t *testing.T) {
	for listen, want := range map[string]string{
		":9464":          "127.0.0.1:9464",
		"0.0.0.0:9464":   "127.0.0.1:9464",
		"[::]:9464":      "[::1]:9464",
		"10.0.0.5:9464":  "10.0.0.5:9464",
		"127.0.0.1:9464": "127.0.0.1:9464",
	} {
		if got, err := probeTarget(listen); err != nil || got != want {
			t.Errorf("probeTarget(%q) = %q, %v; want %q", listen, got, err, want)
		}
	}
	if _, err := probeTarget("9464"); err == nil {
		t.Errorf("probeTarget(9464): no error")
	}
}
