package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// syncBuffer is an io.Writer safe for the daemon's goroutines.
type syncBuffer = testsvc.LogBuffer

func TestRunConfigProblems(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bad.yaml")
	os.WriteFile(cfg, []byte("kafka:\n  brokers: []\n  group: g\n  topics: [t]\nmemcached:\n  servers: [localhost:11211]\n  timeout: 5\nrules: [nowhere.yaml]\n"), 0o644)
	_, errOut, err := invoke(t, "", "run", "-c", cfg)
	if code := exitCode(err); code != exitConfig {
		t.Fatalf("exit code %d (%v), want %d", code, err, exitConfig)
	}
	for _, want := range []string{
		cfg + ":2:12: kafka.brokers: list at least one broker address",
		cfg + ":7:12: memcached.timeout: \"5\" has no unit",
		filepath.Join(dir, "nowhere.yaml") + ": no such file or directory",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if _, _, err := invoke(t, "", "run"); exitCode(err) != 2 {
		t.Errorf("run without -c: exit code %d, want 2", exitCode(err))
	}
}

// TestRunRefusesNoRules: a config whose rule files hold no rule (a
// zero-byte file, a file of comments) is a configuration error, not a
// daemon that consumes and applies nothing.
func TestRunRefusesNoRules(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "empty.yaml"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "later.yaml"), []byte("# rules to come\n"), 0o644)
	const head = "kafka:\n  brokers: [localhost:9092]\n  group: g\n  topics: [t]\nmemcached:\n  servers: [localhost:11211]\nhttp:\n  listen: 127.0.0.1:0\n"
	for _, tc := range []struct{ rules, want string }{
		{"empty.yaml", filepath.Join(dir, "empty.yaml") + ": rule file is empty (0 bytes, no text)"},
		{"later.yaml", ":9:8: rules: no rule in " + filepath.Join(dir, "later.yaml") + ": nothing would be applied"},
	} {
		cfg := filepath.Join(dir, "cfg.yaml")
		os.WriteFile(cfg, []byte(head+"rules: ["+tc.rules+"]\n"), 0o644)
		// Bounded: a daemon that starts anyway is stopped, and fails below.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var errBuf bytes.Buffer
		err := runWithInput(ctx, strings.NewReader(""), []string{"run", "-c", cfg}, io.Discard, &errBuf)
		cancel()
		errOut := errBuf.String()
		if code := exitCode(err); code != exitConfig || !strings.Contains(errOut, tc.want) {
			t.Errorf("rules %s: exit code %d (%v), want %d; stderr:\n%s", tc.rules, code, err, exitConfig, errOut)
		}
	}
}

// TestRunDaemon runs `cachewarden run` against an in-process Kafka-protocol
// broker and the test memcached, then stops it as SIGINT would.
func TestRunDaemon(t *testing.T) {
	mcAddr := testsvc.Memcached(t)
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic)
	prefix := "cwrun:" + testsvc.Unique() + ":"
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(fmt.Sprintf(`version: 1
prefix: %q
rules:
  - name: user-profile
    table: shop.users
    bump: "ns:user:{id}"
`, prefix)), 0o644)
	cfgPath := filepath.Join(dir, "cachewarden.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`kafka:
  brokers: ${CW_TEST_BROKERS}
  group: cw-%s
  topics: [%s]
memcached:
  servers: [%s]
mysql:
  dsn: "nobody:s3cr3t-pw@tcp(127.0.0.1:1)/none"
rules: [rules.yaml]
http:
  listen: "127.0.0.1:0"
log:
  format: json
  level: debug
`, testsvc.Unique(), topic, mcAddr)), 0o644)
	t.Setenv("CW_TEST_BROKERS", strings.Join(brokers, ","))

	ctx := t.Context()
	d := startDaemon(t, cfgPath)
	httpGet := d.get
	if code, _ := httpGet("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	waitUntil(t, 10*time.Second, func() string {
		if code, body := httpGet("/readyz"); code != 200 {
			return fmt.Sprintf("/readyz = %d %s", code, body)
		}
		return ""
	})

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond}
	defer w.Close()
	ev := `{"op":"c","before":null,"after":{"id":77,"name":"x"},"source":{"db":"shop","table":"users"},"ts_ms":1}`
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(ev)}); err != nil {
		t.Fatal(err)
	}
	mc := memcache.New(mcAddr)
	waitUntil(t, 10*time.Second, func() string {
		if _, err := mc.Get(prefix + "ns:user:77"); err != nil {
			return "namespace not bumped: " + err.Error()
		}
		return ""
	})
	waitUntil(t, 10*time.Second, func() string {
		_, body := httpGet("/metrics")
		for _, want := range []string{
			fmt.Sprintf(`cachewarden_events_total{format="debezium",outcome="planned",topic=%q} 1`, topic),
			`cachewarden_commits_total{outcome="ok"} 1`,
			"cachewarden_memcached_requests_total",
			"go_goroutines",
		} {
			if !strings.Contains(body, want) {
				return "/metrics lacks " + want
			}
		}
		return ""
	})

	if err := d.stop(); err != nil { // what SIGINT/SIGTERM do in main
		t.Fatalf("run returned %v after the signal, want nil (exit 0)", err)
	}
	logs := d.stderr.String()
	if strings.Contains(logs, "s3cr3t-pw") {
		t.Errorf("the MySQL password was logged")
	}
	if !strings.Contains(logs, "consumer stopped") {
		t.Errorf("no orderly shutdown in the log")
	}
	// mysql.dsn answers nowhere: the collation check is skipped, logged.
	if !strings.Contains(logs, `"msg":"collations of key columns not checked (cachewarden check --dsn checks them)","error":"MySQL nobody@127.0.0.1:1/none: cannot connect to 127.0.0.1:1: `) {
		t.Errorf("the skipped collation check is not logged")
	}
}

func waitUntil(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %s", timeout, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
