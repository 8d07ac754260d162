// Package pipetest holds what the tests of the pipeline and of the
// sources share: Debezium messages and rules to feed a pipeline, polling,
// a test's log and metric reads. It imports no package of the daemon, so
// that package pipeline's own tests may use it; only tests import it.
package pipetest

import (
	"database/sql"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// MetricValue returns a counter's or gauge's current value.
func MetricValue(m prometheus.Metric) float64 {
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		panic(err)
	}
	if pb.Counter != nil {
		return pb.Counter.GetValue()
	}
	return pb.Gauge.GetValue()
}

// WaitFor polls cond every 20ms until it returns "" or the timeout
// passes, then fails the test with cond's last answer.
func WaitFor(t testing.TB, timeout time.Duration, cond func() string) {
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

// TestLogger logs at debug level into a buffer that is printed when the
// test fails or runs with -v; it never writes to the test after it ended.
func TestLogger(t testing.TB) (*slog.Logger, *testsvc.LogBuffer) {
	buf := &testsvc.LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// Debezium returns the value of a Debezium change event of a MySQL
// connector (no schema envelope).
func Debezium(op, db, table string, before, after map[string]any) []byte {
	ev := map[string]any{
		"op": op, "ts_ms": 1700000000000, "before": before, "after": after,
		"source": map[string]any{"connector": "mysql", "db": db, "table": table, "file": "mysql-bin.000003", "pos": 154, "snapshot": false},
	}
	v, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	return v
}

// Row returns a row image from column, value pairs.
func Row(kv ...any) map[string]any {
	m := make(map[string]any)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// DaemonRules bump users, keep the interests of a user as a set and
// count the comments of a post; PREFIX stands for the test's key prefix.
const DaemonRules = `
version: 1
prefix: "PREFIX"
rules:
  - name: user-profile
    table: shop.users
    bump: "ns:user:{id}"
  - name: user-interests
    table: shop.user_interests
    set:
      key: "interests:{user_id}"
      member: "{interest_id}"
  - name: post-comments
    table: blog.comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      args: [post_id]
`

// RebumpRules bump users with a delayed second bump an hour later.
const RebumpRules = `
version: 1
prefix: "PREFIX"
rules:
  - name: user-profile
    table: shop.users
    bump: "ns:user:{id}"
    rebump_after: 1h
`

// CreateComments creates the table comments (id, post_id) when missing
// and inserts n comments of postID.
func CreateComments(t testing.TB, db *sql.DB, postID, n int) {
	t.Helper()
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS comments (id INT AUTO_INCREMENT PRIMARY KEY, post_id INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := db.Exec("INSERT INTO comments (post_id) VALUES (?)", postID); err != nil {
			t.Fatal(err)
		}
	}
}
