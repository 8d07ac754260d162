package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// waitBound bounds each wait for the server in these tests: a failure
// bound only, far above what a loaded machine needs.
const waitBound = 2 * time.Minute

// randomServerID is a replica server id unlike any other test's.
func randomServerID() uint32 { return 100000 + rand.Uint32N(4000000000-100000) }

// fixture is a fresh database on the server with the binary log on.
type fixture struct {
	db     *sql.DB
	dsn    string
	name   string
	flavor string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db, dsn := testsvc.MySQLBinlog(t)
	f := &fixture{db: db, dsn: dsn}
	ctx := context.Background()
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&f.name); err != nil {
		t.Fatal(err)
	}
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	f.flavor = flavorOf(version)
	return f
}

func (f *fixture) exec(t *testing.T, queries ...string) {
	t.Helper()
	for _, q := range queries {
		if _, err := f.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// tx runs the statements in one transaction on one connection, and
// commits it (or rolls it back).
func (f *fixture) tx(t *testing.T, commit bool, queries ...string) {
	t.Helper()
	tx, err := f.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		if _, err := tx.Exec(q); err != nil {
			tx.Rollback()
			t.Fatalf("%s: %v", q, err)
		}
	}
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// position is the server's current file and position.
func (f *fixture) position(t *testing.T) Start {
	t.Helper()
	p, err := currentPosition(context.Background(), f.db)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// gtidPos is the server's GTID position (MariaDB's gtid_binlog_pos,
// MySQL's gtid_executed).
func (f *fixture) gtidPos(t *testing.T) string {
	t.Helper()
	q := "SELECT @@gtid_binlog_pos"
	if f.flavor != "mariadb" {
		q = "SELECT @@gtid_executed"
	}
	var s string
	if err := f.db.QueryRow(q).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// open opens a stream of the fixture's database only (other tests write
// to the same server) from start.
func (f *fixture) open(t *testing.T, start Start, tweak func(*Config)) *Stream {
	t.Helper()
	cfg := Config{DSN: f.dsn, ServerID: randomServerID(), Flavor: f.flavor, Start: start,
		Heartbeat: time.Second, ReadTimeout: 30 * time.Second,
		Skip: func(db, _ string) bool { return db != f.name }}
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	s, err := Open(ctx, cfg, f.db, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// next reads the next transaction (part).
func next(t *testing.T, s *Stream) *Txn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	txn, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return txn
}

// describe renders events compactly: "insert t id=1,name=a".
func describe(evs []rules.Event) string {
	var b strings.Builder
	for i, ev := range evs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %s", ev.Operation, ev.Table)
		for _, img := range []rules.Row{ev.Before, ev.After} {
			if img == nil {
				continue
			}
			b.WriteByte(' ')
			for j, c := range img {
				if j > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "%s=%s", c.Name, c.Value.Text)
			}
		}
	}
	return b.String()
}

func TestStreamTransactions(t *testing.T) {
	f := newFixture(t)
	f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20)) CHARSET utf8mb4")
	startPos, startGTID := f.position(t), f.gtidPos(t)
	f.tx(t, true,
		"INSERT INTO t VALUES (1, 'a'), (2, 'b')",
		"UPDATE t SET name = 'c' WHERE id = 1",
		"DELETE FROM t WHERE id = 2")
	f.tx(t, false, "INSERT INTO t VALUES (9, 'rolled back')")
	f.exec(t, "INSERT INTO t VALUES (3, 'd')")

	const first = "insert t id=1,name=a; insert t id=2,name=b; update t id=1,name=a id=1,name=c; delete t id=2,name=b"
	const second = "insert t id=3,name=d"
	for _, tc := range []struct {
		name  string
		start Start
	}{
		{"file and position", startPos},
		{"GTID set", Start{GTIDSet: startGTID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := f.open(t, tc.start, nil)
			txn := next(t, s)
			if got := describe(txn.Events); got != first || !txn.Complete || len(txn.Unmapped) != 0 {
				t.Fatalf("first transaction: %s (complete %v, unmapped %v), want %s", got, txn.Complete, txn.Unmapped, first)
			}
			checkSource(t, txn)
			after := next(t, s)
			if got := describe(after.Events); got != second {
				t.Fatalf("second transaction: %s, want %s (a rolled-back one must not appear)", got, second)
			}
			// Resuming after the first transaction reads the second.
			for _, resume := range []Start{{File: txn.End.File, Pos: txn.End.Pos}, {GTIDSet: txn.End.GTIDSet}} {
				if resume.IsZero() {
					continue
				}
				r := f.open(t, resume, nil)
				if got := describe(next(t, r).Events); got != second {
					t.Errorf("resumed from %+v: %s, want %s", resume, got, second)
				}
			}
		})
	}
}

// checkSource checks the positions a complete transaction's events carry.
func checkSource(t *testing.T, txn *Txn) {
	t.Helper()
	for i, ev := range txn.Events {
		src := ev.Source
		if src.BinlogFile != txn.End.File || src.BinlogPos != int64(txn.End.Pos) || src.BinlogPos == 0 {
			t.Errorf("event %d: at %s:%d, want the commit's end %s:%d", i, src.BinlogFile, src.BinlogPos, txn.End.File, txn.End.Pos)
		}
		if src.GTID == "" || src.GTID != txn.GTID || src.ServerID == 0 || src.TsMs <= 0 {
			t.Errorf("event %d: source %+v lacks the GTID %q, server id or time", i, src, txn.GTID)
		}
		if ev.Database == "" {
			t.Errorf("event %d: no database", i)
		}
	}
}

func TestStreamPositionsMatchTheLog(t *testing.T) {
	f := newFixture(t)
	f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY)")
	if f.flavor != "mariadb" {
		t.Skip("testsvc.ExecLogged reads MariaDB's binary log")
	}
	conn, err := f.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := f.position(t)
	logged, err := testsvc.ExecLogged(context.Background(), conn, "INSERT INTO t VALUES (1)")
	if err != nil {
		t.Fatal(err)
	}
	txn := next(t, f.open(t, start, nil))
	if txn.GTID != logged.GTID || txn.End.File != logged.File || int64(txn.End.Pos) != logged.CommitEnd {
		t.Fatalf("transaction %s ends at %s:%d, the log says %s ends at %s:%d", txn.GTID, txn.End.File, txn.End.Pos, logged.GTID, logged.File, logged.CommitEnd)
	}
	checkSource(t, txn)
}

func TestStreamChunks(t *testing.T) {
	f := newFixture(t)
	f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY)")
	start := f.position(t)
	f.tx(t, true, "INSERT INTO t VALUES (1),(2),(3),(4)", "INSERT INTO t VALUES (5),(6),(7)")
	f.exec(t, "INSERT INTO t VALUES (8)")
	// A transaction of exactly two parts still ends with a complete one.
	f.tx(t, true, "INSERT INTO t VALUES (11),(12),(13),(14),(15),(16)")
	s := f.open(t, start, func(c *Config) { c.MaxEvents = 3 })
	var got []string
	for range 7 {
		txn := next(t, s)
		got = append(got, fmt.Sprintf("%d:%v", len(txn.Events), txn.Complete))
		if !txn.Complete && txn.End != (Start{}) {
			t.Errorf("a part that does not complete its transaction has an end position %+v", txn.End)
		}
	}
	if want := "3:false 3:false 1:true 1:true 3:false 3:false 0:true"; strings.Join(got, " ") != want {
		t.Fatalf("parts %s, want %s", strings.Join(got, " "), want)
	}
}

func TestStreamTruncateAndSkip(t *testing.T) {
	f := newFixture(t)
	f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE ckpt (id INT PRIMARY KEY)")
	start := f.position(t)
	f.exec(t, "INSERT INTO ckpt VALUES (1)", "INSERT INTO t VALUES (1)", "TRUNCATE TABLE ckpt", "TRUNCATE t")
	s := f.open(t, start, func(c *Config) {
		c.Skip = func(db, table string) bool { return db != f.name || table == "ckpt" }
	})
	if got := describe(next(t, s).Events); got != "insert t id=1" {
		t.Fatalf("first: %s, want the insert into t (ckpt skipped)", got)
	}
	txn := next(t, s)
	if len(txn.Events) != 1 || txn.Events[0].Operation != rules.Truncate || txn.Events[0].Table != "t" || txn.Events[0].Database != f.name {
		t.Fatalf("second: %s, want truncate t", describe(txn.Events))
	}
}

// setRowMetadata sets binlog_row_metadata for the test and restores it.
// It is global: tests that set it do not run in parallel.
func setRowMetadata(t *testing.T, db *sql.DB, value string) {
	t.Helper()
	var old string
	if err := db.QueryRow("SELECT @@GLOBAL.binlog_row_metadata").Scan(&old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("SET GLOBAL binlog_row_metadata = " + value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("SET GLOBAL binlog_row_metadata = '" + old + "'"); err != nil {
			t.Errorf("restore binlog_row_metadata: %v", err)
		}
	})
}

func TestStreamAlterAddColumn(t *testing.T) {
	for _, meta := range []string{"FULL", "MINIMAL", "NO_LOG"} {
		t.Run(meta, func(t *testing.T) {
			f := newFixture(t)
			setRowMetadata(t, f.db, meta)
			f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(5))")
			s := f.open(t, f.position(t), nil)
			f.exec(t, "INSERT INTO t VALUES (1, 'x')")
			// Read before the ALTER: without names in the log, the names
			// are information_schema's of the moment.
			if got := describe(next(t, s).Events); got != "insert t id=1,a=x" {
				t.Fatalf("before ALTER: %s", got)
			}
			f.exec(t, "ALTER TABLE t ADD COLUMN b INT AFTER id", "INSERT INTO t VALUES (2, 7, 'y')")
			if got := describe(next(t, s).Events); got != "insert t id=2,b=7,a=y" {
				t.Fatalf("after ALTER: %s", got)
			}
		})
	}
}

func TestStreamTableChangedSinceRow(t *testing.T) {
	f := newFixture(t)
	setRowMetadata(t, f.db, "NO_LOG")
	f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY)")
	start := f.position(t)
	f.exec(t, "INSERT INTO t VALUES (1)", "ALTER TABLE t ADD COLUMN b INT")
	txn := next(t, f.open(t, start, nil))
	if len(txn.Events) != 0 || len(txn.Unmapped) != 1 {
		t.Fatalf("got events %s and unmapped %v, want the row unmapped", describe(txn.Events), txn.Unmapped)
	}
	u := txn.Unmapped[0]
	if u.Database != f.name || u.Table != "t" || !errors.Is(u.Err, ErrColumnCount) {
		t.Fatalf("unmapped %s.%s: %v, want %s.t and a column count mismatch", u.Database, u.Table, u.Err, f.name)
	}
	for _, want := range []string{f.name + ".t", "1 columns", "information_schema 2", ":"} {
		if !strings.Contains(u.Err.Error(), want) {
			t.Errorf("error %q does not say %q", u.Err, want)
		}
	}
}

func TestStreamFullMetadataReadAfterAlter(t *testing.T) {
	f := newFixture(t)
	setRowMetadata(t, f.db, "FULL")
	f.exec(t, "CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(5))")
	start := f.position(t)
	f.exec(t, "INSERT INTO t VALUES (1, 'x')", "ALTER TABLE t ADD COLUMN b INT AFTER id", "INSERT INTO t VALUES (2, 7, 'y')")
	// Both rows are read after the ALTER: their names come from the log.
	s := f.open(t, start, nil)
	for _, want := range []string{"insert t id=1,a=x", "insert t id=2,b=7,a=y"} {
		txn := next(t, s)
		if got := describe(txn.Events); got != want || len(txn.Unmapped) != 0 {
			t.Fatalf("got %s (unmapped %v), want %s", got, txn.Unmapped, want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	base := Config{DSN: "u:p@tcp(" + testsvc.ClosedAddr(t) + ")/", ServerID: 7, Flavor: "mariadb", Start: Start{File: "mysql-bin.000001", Pos: 4}}
	cases := []struct {
		name  string
		tweak func(*Config)
		want  string
	}{
		{"server id 0", func(c *Config) { c.ServerID = 0 }, "server id 0 is not allowed"},
		{"unknown flavor", func(c *Config) { c.Flavor = "postgres" }, `flavor "postgres"`},
		{"position without file", func(c *Config) { c.Start = Start{Pos: 120} }, "start position 120 has no file name"},
		{"socket address", func(c *Config) { c.DSN = "u@unix(/tmp/mysql.sock)/" }, "want tcp(host:port)"},
		{"bad DSN", func(c *Config) { c.DSN = "u@tcp(h:1" }, "binlog: DSN"},
		{"read timeout within a heartbeat", func(c *Config) { c.Heartbeat, c.ReadTimeout = time.Second, time.Second }, "must exceed the heartbeat period"},
		{"bad GTID set", func(c *Config) { c.Start = Start{GTIDSet: "x-y"} }, `start GTID set "x-y"`},
		{"nothing listens", nil, "start reading 127.0.0.1 at mysql-bin.000001:4"},
		{"no start and no handle", func(c *Config) { c.Start = Start{} }, "no start position and no database handle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			if tc.tweak != nil {
				tc.tweak(&cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitBound)
			defer cancel()
			s, err := Open(ctx, cfg, nil, nil)
			if err == nil {
				s.Close()
				t.Fatalf("Open succeeded, want an error saying %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestNextAfterClose(t *testing.T) {
	f := newFixture(t)
	s := f.open(t, f.position(t), nil)
	s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if _, err := s.Next(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("Next after Close: %v (context %v), want the stream's error", err, ctx.Err())
	}
}
