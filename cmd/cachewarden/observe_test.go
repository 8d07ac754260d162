package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

func TestObserveUsage(t *testing.T) {
	if _, _, err := invoke(t, "", "observe"); exitCode(err) != 2 {
		t.Errorf("observe without -c: exit code %d, want 2", exitCode(err))
	}
	if out, _, err := invoke(t, "", "help"); err != nil || !strings.Contains(out, "  observe ") {
		t.Errorf("help does not list observe (%v):\n%s", err, out)
	}
	if out, _, err := invoke(t, "", "help", "observe"); err != nil || !strings.Contains(out, "consumer group of") {
		t.Errorf("help observe (%v):\n%s", err, out)
	}
}

// TestObserveCommand runs `cachewarden observe` against an in-process
// Kafka-protocol broker and the test memcached: it joins its own group,
// checks the change published after it started through /status, and
// writes nothing (the namespace it checks stays as it was, so the
// detached observer cannot judge it).
func TestObserveCommand(t *testing.T) {
	mcAddr := testsvc.Memcached(t)
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic)
	prefix := "cwobs:" + testsvc.Unique() + ":"
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
  brokers: [%s]
  group: cw-%s
  topics: [%s]
memcached:
  servers: [%s]
rules: [rules.yaml]
http:
  listen: "127.0.0.1:0"
log:
  format: json
observer:
  sample: 1
  windows: [200ms]
`, strings.Join(brokers, ", "), testsvc.Unique(), topic, mcAddr)), 0o644)
	mc := memcache.New(mcAddr)
	key := prefix + "ns:user:77"
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("1782579200000000005")}); err != nil {
		t.Fatal(err)
	}

	ctx := t.Context()
	d := startCommand(t, "observing", "observe", "-c", cfgPath)
	if group := fmt.Sprint(d.ready["group"]); !strings.HasSuffix(group, "-observer") {
		t.Errorf("observing in group %q, want kafka.group-observer", group)
	}
	httpGet := func(path string) string {
		_, body := d.get(path)
		return body
	}
	waitUntil(t, 20*time.Second, func() string {
		if body := httpGet("/metrics"); !strings.Contains(body, "cachewarden_assigned_partitions 1") {
			return "partition not assigned yet"
		}
		return ""
	})
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond}
	defer w.Close()
	ev := `{"op":"u","before":{"id":77,"name":"a"},"after":{"id":77,"name":"x"},"source":{"db":"shop","table":"users"},"ts_ms":1}`
	if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(ev)}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, func() string {
		body := httpGet("/status")
		var st struct {
			Observer struct {
				Detached bool
				Windows  []struct {
					Total struct {
						NotJudged int `json:"not_judged"`
					}
				}
			}
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return err.Error() + ": " + body
		}
		if !st.Observer.Detached || len(st.Observer.Windows) != 1 || st.Observer.Windows[0].Total.NotJudged != 1 {
			return "/status: " + body
		}
		return ""
	})
	if it, err := mc.Get(key); err != nil || string(it.Value) != "1782579200000000005" {
		t.Errorf("observe changed %s: %v %v", key, it, err)
	}
	if err := d.stop(); err != nil {
		t.Fatalf("observe returned %v after the signal, want nil", err)
	}
}

// TestObserveRefusesBinlogSource: observe follows Kafka topics; with the
// binary log source it says so and names the setting to use instead.
func TestObserveRefusesBinlogSource(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("version: 1\nrules:\n  - name: u\n    table: shop.users\n    bump: \"ns:user:{id}\"\n"), 0o644)
	cfg := filepath.Join(dir, "cachewarden.yaml")
	os.WriteFile(cfg, []byte("source: binlog\nbinlog:\n  dsn: \"u:p@tcp(127.0.0.1:1)/\"\n  server_id: 9\nmemcached:\n  servers: [127.0.0.1:1]\nrules: [rules.yaml]\n"), 0o644)
	_, _, err := invoke(t, "", "observe", "-c", cfg)
	if err == nil || !strings.Contains(err.Error(), "source is binlog") || !strings.Contains(err.Error(), "observer.enabled: true") {
		t.Errorf("observe with source binlog: %v", err)
	}
}
