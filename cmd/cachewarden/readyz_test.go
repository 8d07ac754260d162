package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// writeCountConfig writes a config whose rules include a count rule with
// a recount query (so the daemon needs MySQL at dsn) and returns its path.
func writeCountConfig(t *testing.T, brokers []string, topic, mc, dsn string) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(fmt.Sprintf(`version: 1
prefix: "cwready:%s:"
rules:
  - name: user
    table: shop.users
    bump: "ns:user:{id}"
  - name: post-comments
    table: blog.comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"
`, testsvc.Unique())), 0o644)
	path := filepath.Join(dir, "cachewarden.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf(`kafka:
  brokers: [%s]
  group: cw-ready-%s
  topics: [%s]
  dlq_topic: %s.dlq
memcached:
  servers: [%s]
mysql:
  dsn: %q
rules: [rules.yaml]
http:
  listen: "127.0.0.1:0"
`, strings.Join(brokers, ","), testsvc.Unique(), topic, topic, mc, dsn)), 0o644)
	return path
}

// TestReadyzNamesUnreachableMySQL runs the daemon with a rule that
// recounts from MySQL and a DSN where nothing listens: /readyz must fail
// naming MySQL's address and the rule, and cachewarden_mysql_up{addr} be
// 0. With the test MariaDB it is ready and the gauge is 1.
func TestReadyzNamesUnreachableMySQL(t *testing.T) {
	mc := testsvc.Memcached(t)
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, topic, topic+".dlq")
	closed := closedAddr(t)

	t.Run("unreachable", func(t *testing.T) {
		d := startDaemon(t, writeCountConfig(t, brokers, topic, mc, "root@tcp("+closed+")/x"))
		waitUntil(t, 20*time.Second, func() string {
			code, body := d.get("/readyz")
			if code != 503 || !strings.Contains(body, "mysql: "+closed+" unreachable") || !strings.Contains(body, "post-comments") {
				return fmt.Sprintf("/readyz = %d %q", code, body)
			}
			if m := d.metricsText(); !strings.Contains(m, fmt.Sprintf("cachewarden_mysql_up{addr=%q} 0", closed)) {
				return "no cachewarden_mysql_up 0 for " + closed
			}
			return ""
		})
		// Nothing but MySQL keeps it from being ready.
		waitUntil(t, 20*time.Second, func() string {
			_, body := d.get("/readyz")
			if lines := strings.Split(strings.TrimSpace(body), "\n"); len(lines) != 2 {
				return "/readyz: " + body
			}
			return ""
		})
		recs, _ := jsonRecords(d.stderr.String())
		logged := false
		for _, r := range recs {
			logged = logged || (r["msg"] == "MySQL unreachable; not ready" && r["addr"] == closed)
		}
		if !logged {
			t.Errorf("no warning naming MySQL in the log")
		}
	})

	t.Run("reachable", func(t *testing.T) {
		dsn := testsvc.MySQLDSN(t)
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		addr := cfg.Addr
		d := startDaemon(t, writeCountConfig(t, brokers, topic, mc, dsn))
		waitUntil(t, 20*time.Second, func() string {
			if code, body := d.get("/readyz"); code != 200 {
				return fmt.Sprintf("/readyz = %d %q", code, body)
			}
			if m := d.metricsText(); !strings.Contains(m, fmt.Sprintf("cachewarden_mysql_up{addr=%q} 1\n", addr)) {
				return "cachewarden_mysql_up not 1 for " + addr
			}
			return ""
		})
	})
}
