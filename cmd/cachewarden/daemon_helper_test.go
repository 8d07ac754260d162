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

// runningDaemon is a serving command (`run`, `observe`) started
// in-process by startDaemon or startCommand.
type runningDaemon struct {
	t      *testing.T
	addr   string
	stderr *syncBuffer
	// ready is the log record that named the HTTP address.
	ready  map[string]any
	cancel context.CancelFunc
	done   chan error
	// stopped and err: stop was called, and what the command returned.
	stopped bool
	err     error
}

// startDaemon runs `cachewarden --log-format json run -c cfgPath` until the
// test ends, and waits for its HTTP address.
func startDaemon(t *testing.T, cfgPath string) *runningDaemon {
	t.Helper()
	return startCommand(t, "serving", "run", "-c", cfgPath)
}

// startCommand runs `cachewarden --log-format json ARGS...` until the test
// ends or stop is called, and waits for its log record whose message
// starts with ready and names the HTTP address (addr).
func startCommand(t *testing.T, ready string, args ...string) *runningDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningDaemon{t: t, stderr: &syncBuffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() {
		d.done <- runWithInput(ctx, strings.NewReader(""), append([]string{"--log-format", "json"}, args...), io.Discard, d.stderr)
	}()
	t.Cleanup(func() {
		if !d.stopped {
			if err := d.stop(); err != nil {
				t.Errorf("%s: %v", args[0], err)
			}
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("%s log:\n%s", args[0], d.stderr.String())
		}
	})
	waitUntil(t, 10*time.Second, func() string {
		recs, _ := jsonRecords(d.stderr.String())
		for _, r := range recs {
			if addr, ok := r["addr"].(string); ok && strings.HasPrefix(fmt.Sprint(r["msg"]), ready) {
				d.addr, d.ready = addr, r
				return ""
			}
		}
		select {
		case err := <-d.done:
			t.Fatalf("%s returned early: %v\n%s", args[0], err, d.stderr.String())
		default:
		}
		return "no HTTP address logged yet"
	})
	return d
}

// stop cancels the command, as SIGINT or SIGTERM do in main, and returns
// what it returned; the test fails if it does not stop within 30s.
func (d *runningDaemon) stop() error {
	if d.stopped {
		return d.err
	}
	d.stopped = true
	d.cancel()
	select {
	case d.err = <-d.done:
	case <-time.After(30 * time.Second):
		d.t.Fatal("the command did not stop")
	}
	return d.err
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
