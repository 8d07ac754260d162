package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// runningDaemon is `cachewarden run` started in-process by startDaemon.
type runningDaemon struct {
	t      *testing.T
	addr   string
	stderr *syncBuffer
}

// startDaemon runs `cachewarden --log-format json run -c cfgPath` until the
// test ends, and waits for its HTTP address.
func startDaemon(t *testing.T, cfgPath string) *runningDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningDaemon{t: t, stderr: &syncBuffer{}}
	done := make(chan error, 1)
	go func() {
		done <- runWithInput(ctx, strings.NewReader(""), []string{"--log-format", "json", "run", "-c", cfgPath}, io.Discard, d.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("run did not stop")
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.stderr.String())
		}
	})
	waitUntil(t, 10*time.Second, func() string {
		recs, _ := jsonRecords(d.stderr.String())
		for _, r := range recs {
			if addr, ok := r["addr"].(string); ok && strings.HasPrefix(fmt.Sprint(r["msg"]), "serving") {
				d.addr = addr
				return ""
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v\n%s", err, d.stderr.String())
		default:
		}
		return "no HTTP address logged yet"
	})
	return d
}

// get returns the status and body of GET path on the daemon.
func (d *runningDaemon) get(path string) (int, string) {
	resp, err := http.Get("http://" + d.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricsText returns the daemon's /metrics.
func (d *runningDaemon) metricsText() string {
	code, body := d.get("/metrics")
	if code != http.StatusOK {
		d.t.Fatalf("/metrics = %d %s", code, body)
	}
	return body
}
