package doctor

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// closedAddr is a loopback address where nothing listens.
var closedAddr = testsvc.ClosedAddr

// silentAddr accepts connections and never answers, as a server of the
// wrong protocol that waits for its own greeting would.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return ln.Addr().String()
}

// load writes a config and its rule file and loads them.
func load(t *testing.T, brokers []string, topic, dlq string, servers []string, dsn string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(`version: 1
prefix: "cwdoctor:"
rules:
  - name: user
    table: shop.users
    bump: "ns:user:{id}"
  - name: post-comments
    table: comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"
`), 0o644)
	dlqLine := ""
	if dlq != "" {
		dlqLine = "  dlq_topic: " + dlq + "\n"
	}
	mysqlSection := ""
	if dsn != "" {
		mysqlSection = fmt.Sprintf("mysql:\n  dsn: %q\n", dsn)
	}
	path := filepath.Join(dir, "cachewarden.yaml")
	os.WriteFile(path, []byte(fmt.Sprintf("kafka:\n  brokers: [%s]\n  group: cw-doctor-%s\n  topics: [%s]\n%smemcached:\n  servers: [%s]\n  timeout: 2s\n%srules: [rules.yaml]\n",
		strings.Join(brokers, ","), testsvc.Unique(), topic, dlqLine, strings.Join(servers, ", "), mysqlSection)), 0o644)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// find returns the finding of area whose subject starts with subject.
func find(t *testing.T, rep *Report, area, subject string) Finding {
	t.Helper()
	for _, f := range rep.Findings {
		if f.Area == area && strings.HasPrefix(f.Subject, subject) {
			return f
		}
	}
	var buf bytes.Buffer
	rep.Write(&buf)
	t.Fatalf("no %s finding for %s:\n%s", area, subject, buf.String())
	return Finding{}
}

func expect(t *testing.T, f Finding, st Status, detail string) {
	t.Helper()
	if f.Status != st || !strings.Contains(f.Detail, detail) {
		t.Errorf("%s %s: %s %q, want %s with %q", f.Area, f.Subject, f.Status, f.Detail, st, detail)
	}
}

// TestDoctorHealthy checks a deployment where everything is in place: the
// topic and the DLQ on a Kafka-protocol broker with the group's commits,
// a real memcached, and MariaDB with the binary log.
func TestDoctorHealthy(t *testing.T) {
	mc := testsvc.Memcached(t)
	db, dsn := testsvc.MySQLBinlog(t)
	if _, err := db.Exec("CREATE TABLE comments (id INT PRIMARY KEY, post_id INT NOT NULL, approved TINYINT NOT NULL, KEY (post_id))"); err != nil {
		t.Fatal(err)
	}
	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 3, topic, topic+".dlq")
	cfg := load(t, brokers, topic, topic+".dlq", []string{mc}, dsn)

	// The group has read part of partition 0.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for i := range 5 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(fmt.Sprint(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: topic, Partition: 0, At: 2, LeaderEpoch: -1})
	if _, err := kadm.NewClient(cl).CommitOffsets(ctx, cfg.Kafka.Group, offsets); err != nil {
		t.Fatal(err)
	}

	rep := Run(ctx, Options{Config: cfg})
	var buf bytes.Buffer
	rep.Write(&buf)
	t.Logf("doctor:\n%s", buf.String())
	if n := rep.Count(Fail); n > 0 {
		t.Errorf("%d failures on a healthy deployment", n)
	}
	expect(t, find(t, rep, "kafka", "topic "+topic), OK, "3 partitions")
	expect(t, find(t, rep, "kafka", "dlq "+topic+".dlq"), OK, "3 partitions")
	expect(t, find(t, rep, "kafka", "group "+cfg.Kafka.Group+" "+topic), OK, "lag 3 messages")
	expect(t, find(t, rep, "memcached", mc), OK, "meta protocol")
	expect(t, find(t, rep, "mysql", "log_bin"), OK, "ON")
	expect(t, find(t, rep, "mysql", "binlog_format"), OK, "ROW")
	expect(t, find(t, rep, "mysql", "rule post-comments query"), OK, "readable")
	if !strings.Contains(buf.String(), " 0 failed\n") {
		t.Errorf("summary:\n%s", buf.String())
	}
}

// TestDoctorFindsWhatIsWrong gives the doctor a missing topic and DLQ, a
// memcached server that is down and one that never answers, and a MySQL
// user without SELECT on the counted table: each is a failure naming the
// cause, and none of them hangs the run.
func TestDoctorFindsWhatIsWrong(t *testing.T) {
	mc := testsvc.Memcached(t)
	db, dsn := testsvc.MySQLBinlog(t)
	for _, stmt := range []string{
		"CREATE TABLE comments (id INT PRIMARY KEY, post_id INT NOT NULL, approved TINYINT NOT NULL)",
		"CREATE TABLE other (id INT PRIMARY KEY)",
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	user := "cwdoc" + testsvc.Unique()[:8]
	for _, stmt := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
		"CREATE USER '" + user + "'@'localhost' IDENTIFIED BY 'pw'",
		"CREATE USER '" + user + "'@'127.0.0.1' IDENTIFIED BY 'pw'",
		// The database is reachable, the counted table is not.
		"GRANT SELECT ON " + mcfg.DBName + ".other TO '" + user + "'@'%'",
		"GRANT SELECT ON " + mcfg.DBName + ".other TO '" + user + "'@'localhost'",
		"GRANT SELECT ON " + mcfg.DBName + ".other TO '" + user + "'@'127.0.0.1'",
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, host := range []string{"%", "localhost", "127.0.0.1"} {
			db.Exec("DROP USER IF EXISTS '" + user + "'@'" + host + "'")
		}
	})
	limited := *mcfg
	limited.User, limited.Passwd = user, "pw"

	topic := "cdc-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 1, "other-"+topic)
	down, silent := closedAddr(t), silentAddr(t)
	cfg := load(t, brokers, topic, topic+".dlq", []string{mc, down, silent}, limited.FormatDSN())

	start := time.Now()
	rep := Run(context.Background(), Options{Config: cfg, Timeout: 5 * time.Second})
	var buf bytes.Buffer
	rep.Write(&buf)
	t.Logf("doctor in %s:\n%s", time.Since(start).Round(time.Millisecond), buf.String())

	expect(t, find(t, rep, "kafka", "topic "+topic), Fail, "not readable")
	expect(t, find(t, rep, "kafka", "dlq "+topic+".dlq"), Fail, "poison messages will hold their partitions")
	expect(t, find(t, rep, "memcached", mc), OK, "meta protocol")
	expect(t, find(t, rep, "memcached", down), Fail, "unreachable")
	expect(t, find(t, rep, "memcached", silent), Fail, "timeout")
	expect(t, find(t, rep, "kafka", "group "+cfg.Kafka.Group), Warn, "never joined")
	expect(t, find(t, rep, "mysql", "rule post-comments query"), Fail, "no SELECT privilege")
	if rep.Count(Fail) != 5 {
		t.Errorf("%d failures, want 5", rep.Count(Fail))
	}
	if strings.Contains(buf.String(), "pw") {
		t.Errorf("the report shows the password:\n%s", buf.String())
	}
}

// TestDoctorBinlogSource checks the binary log source's server instead of
// Kafka: the MariaDB with the binary log is fine; one without it, or a
// server id it already has, fails with the setting named.
func TestDoctorBinlogSource(t *testing.T) {
	binlogDSN := testsvc.MySQLBinlogDSN(t)
	plainDSN := testsvc.MySQLDSN(t)
	mc := testsvc.Memcached(t)
	loadBinlog := func(dsn string, serverID int) *config.Config {
		t.Helper()
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("version: 1\nrules:\n  - name: user\n    table: shop.users\n    bump: \"ns:user:{id}\"\n"), 0o644)
		path := filepath.Join(dir, "cachewarden.yaml")
		os.WriteFile(path, fmt.Appendf(nil, "source: binlog\nbinlog:\n  dsn: %q\n  server_id: %d\nmemcached:\n  servers: [%s]\nrules: [rules.yaml]\n", dsn, serverID, mc), 0o644)
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ctx := context.Background()
	rep := Run(ctx, Options{Config: loadBinlog(binlogDSN, 987654)})
	if n := rep.Count(Fail); n != 0 {
		var buf bytes.Buffer
		rep.Write(&buf)
		t.Errorf("%d failures on the binary log server:\n%s", n, buf.String())
	}
	for _, f := range rep.Findings {
		if f.Area == "kafka" {
			t.Errorf("a kafka finding with the binlog source: %+v", f)
		}
	}
	var ownID int
	db, _ := testsvc.MySQLBinlog(t)
	if err := db.QueryRow("SELECT @@server_id").Scan(&ownID); err != nil {
		t.Fatal(err)
	}
	rep = Run(ctx, Options{Config: loadBinlog(binlogDSN, ownID)})
	if rep.Count(Fail) == 0 {
		t.Errorf("the server's own server id %d was accepted", ownID)
	}
	if !isBinlogServer(t, plainDSN) {
		rep = Run(ctx, Options{Config: loadBinlog(plainDSN, 987654)})
		found := false
		for _, f := range rep.Findings {
			found = found || f.Area == "binlog" && f.Status == Fail && strings.Contains(f.Detail, "log_bin")
		}
		if !found {
			var buf bytes.Buffer
			rep.Write(&buf)
			t.Errorf("no log_bin failure for a server without the binary log:\n%s", buf.String())
		}
	}
}

// isBinlogServer reports whether the server dsn names logs.
func isBinlogServer(t *testing.T, dsn string) bool {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.DBName = ""
	db, err := sqlOpen(c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var on int
	if err := db.QueryRow("SELECT @@log_bin").Scan(&on); err != nil {
		t.Fatal(err)
	}
	return on == 1
}

func sqlOpen(dsn string) (*sql.DB, error) { return sql.Open("mysql", dsn) }
