package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// reloadRules is a rule file of one bump rule whose key is KEY.
const reloadRules = `version: 1
prefix: %q
rules:
  - name: user-profile
    table: shop.users
    bump: %q
`

// TestRunReloadsRulesOnSIGHUP runs the daemon, edits its rule file and
// sends SIGHUP: later events are planned with the new rule, the reload
// is counted and the new digest exported. A broken rule file sent with
// SIGHUP keeps the rules as they were and logs the problem with its
// file:line:col.
func TestRunReloadsRulesOnSIGHUP(t *testing.T) {
	mcAddr := testsvc.Memcached(t)
	mc := memcache.New(mcAddr)
	prefix := "cwreload:" + testsvc.Unique() + ":"
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic)
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	writeRules := func(text string) string {
		t.Helper()
		if err := os.WriteFile(rulesPath, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(text))
		return hex.EncodeToString(sum[:])
	}
	first := writeRules(fmt.Sprintf(reloadRules, prefix, "ns:user:{id}"))
	cfg := filepath.Join(dir, "cachewarden.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`kafka:
  brokers: [%s]
  group: cw-reload-%s
  topics: [%s]
memcached:
  servers: [%s]
rules: [rules.yaml]
http:
  listen: "127.0.0.1:0"
`, strings.Join(brokers, ","), testsvc.Unique(), topic, mcAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cfg)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	applied := func(id int, key string) {
		t.Helper()
		if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(userEvent(id))}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 30*time.Second, func() string {
			if got := mcGet(t, mc, prefix+key); got == "<missing>" {
				return key + " not bumped"
			}
			return ""
		})
	}
	metric := func(line string) func() string {
		return func() string {
			if m := d.metricsText(); !strings.Contains(m, line+"\n") {
				return "no " + line + " in /metrics"
			}
			return ""
		}
	}
	waitUntil(t, 10*time.Second, metric(`cachewarden_rules_info{digest="`+first+`"} 1`))
	applied(1, "ns:user:1")

	// A new key: the events after the reload use it.
	second := writeRules(fmt.Sprintf(reloadRules, prefix, "ns:member:{id}"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, metric(`cachewarden_rules_reload_total{result="ok"} 1`))
	waitUntil(t, 10*time.Second, metric(`cachewarden_rules_info{digest="`+second+`"} 1`))
	applied(2, "ns:member:2")
	if got := mcGet(t, mc, prefix+"ns:user:2"); got != "<missing>" {
		t.Errorf("ns:user:2 = %q: the event after the reload was planned with the old rule", got)
	}

	// A broken file: the rules stay, the log names the place.
	writeRules(fmt.Sprintf(reloadRules, prefix, "ns:member:{id") + "    colour: red\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, metric(`cachewarden_rules_reload_total{result="error"} 1`))
	if m := d.metricsText(); !strings.Contains(m, `cachewarden_rules_info{digest="`+second+`"} 1`) || strings.Count(m, "\ncachewarden_rules_info{") != 1 {
		t.Errorf("after a failed reload, /metrics does not export the previous digest alone:\n%s", grepLines(m, "cachewarden_rules_info"))
	}
	var logged map[string]any
	recs, _ := jsonRecords(d.stderr.String())
	for _, r := range recs {
		if r["msg"] == "rules not reloaded: the rules loaded before stay" {
			logged = r
		}
	}
	if e, _ := logged["error"].(string); !strings.Contains(e, rulesPath+":6:") || !strings.Contains(e, "colour") || logged["level"] != "ERROR" {
		t.Errorf("the failed reload logged %v, want an error naming %s:6:COL and the unknown field", logged, rulesPath)
	}
	applied(3, "ns:member:3")
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}
