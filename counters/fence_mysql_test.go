package counters

import (
	"context"
	"database/sql"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// binlogDB is a fresh database with a comments table on a server whose
// binary log is on, and a connection whose row changes report where they
// landed in the log.
type binlogDB struct {
	t    testing.TB
	m    *MySQL
	db   *sql.DB
	dsn  string
	conn *sql.Conn
}

func newBinlogDB(t testing.TB) *binlogDB {
	t.Helper()
	db, dsn := testsvc.MySQLBinlog(t)
	if _, err := db.Exec(`CREATE TABLE comments (id BIGINT UNSIGNED PRIMARY KEY AUTO_INCREMENT,
		post_id BIGINT UNSIGNED NOT NULL, author VARCHAR(200) NOT NULL DEFAULT '',
		approved TINYINT NOT NULL DEFAULT 1, KEY (post_id)) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &binlogDB{t: t, m: NewMySQL(db, DBConfig{MaxOpenConns: 4}, slog.New(slog.DiscardHandler)), db: db, dsn: dsn, conn: conn}
}

// insert adds a comment to post and returns the position a CDC connector
// would give its event (the row event's start, as Debezium does).
func (b *binlogDB) insert(post int) rules.Position {
	b.t.Helper()
	tx, err := testsvc.ExecLogged(context.Background(), b.conn, "INSERT INTO comments (post_id) VALUES (?)", post)
	if err != nil {
		b.t.Fatal(err)
	}
	return rules.Position{BinlogFile: tx.File, BinlogPos: tx.RowsPos}
}

// insertGTID adds a comment to post and returns the position of an event
// that carries only the transaction's GTID (no binary log position).
func (b *binlogDB) insertGTID(post int) rules.Position {
	b.t.Helper()
	tx, err := testsvc.ExecLogged(context.Background(), b.conn, "INSERT INTO comments (post_id) VALUES (?)", post)
	if err != nil {
		b.t.Fatal(err)
	}
	return rules.Position{GTID: tx.GTID}
}

func (b *binlogDB) count(post int) int64 {
	b.t.Helper()
	var n int64
	if err := b.db.QueryRow("SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1", post).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

const commentsQuery = "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"

func TestCountInSnapshotPosition(t *testing.T) {
	b := newBinlogDB(t)
	ctx := context.Background()
	before := b.insert(1)
	b.insert(1)
	sc, err := b.m.CountInSnapshot(ctx, commentsQuery, []rules.Value{intValue("1")}, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sc.N != 2 || !sc.At.Known() || sc.NoPosition != "" {
		t.Fatalf("CountInSnapshot = %+v, want 2 at a known position", sc)
	}
	if order, ok := ComparePositions(PositionOf(before), sc.At); !ok || order >= 0 {
		t.Fatalf("an earlier insert at %v is not before the snapshot at %v", before, sc.At)
	}
	after := b.insert(1)
	if order, ok := ComparePositions(PositionOf(after), sc.At); !ok || order <= 0 {
		t.Fatalf("a later insert at %v is not after the snapshot at %v", after, sc.At)
	}
}

// TestCountInSnapshotExcludesLaterCommits commits a row while the recount
// query runs: the snapshot started earlier, so neither the count nor the
// position include it.
func TestCountInSnapshotExcludesLaterCommits(t *testing.T) {
	b := newBinlogDB(t)
	b.insert(2)
	slow := "SELECT COUNT(*) + SLEEP(0.4) FROM comments WHERE post_id = ? AND approved = 1"
	inserted := make(chan rules.Position, 1)
	go func() {
		// Wait until the recount query is running, then commit a row.
		for range 200 {
			var n int
			b.db.QueryRow("SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE 'SELECT COUNT(*) + SLEEP(0.4)%'").Scan(&n)
			if n > 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		tx, err := testsvc.ExecLogged(context.Background(), b.conn, "INSERT INTO comments (post_id) VALUES (2)")
		if err != nil {
			t.Error(err)
		}
		inserted <- rules.Position{BinlogFile: tx.File, BinlogPos: tx.RowsPos}
	}()
	sc, err := b.m.CountInSnapshot(context.Background(), slow, []rules.Value{intValue("2")}, SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	during := <-inserted
	if sc.N != 1 {
		t.Fatalf("count = %d, want 1: the row committed during the query is after the snapshot", sc.N)
	}
	if order, ok := ComparePositions(PositionOf(during), sc.At); !ok || order <= 0 {
		t.Fatalf("the row committed during the query at %v is not after the snapshot at %v", during, sc.At)
	}
	if n := b.count(2); n != 2 {
		t.Fatalf("table holds %d rows, want 2", n)
	}
}

func TestCountInSnapshotWithoutBinlog(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	var on int
	if err := db.QueryRow("SELECT @@log_bin").Scan(&on); err != nil {
		t.Fatal(err)
	}
	if on == 1 {
		t.Skip("the server at CACHEWARDEN_TEST_MYSQL_DSN has its binary log on; this test needs one without")
	}
	addComments(t, db, 3, "ann", 2)
	for range 2 { // the second call trusts the first answer
		sc, err := m.CountInSnapshot(context.Background(), commentsQuery, []rules.Value{intValue("3")}, SnapshotOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sc.N != 2 || sc.At.Known() || !strings.Contains(sc.NoPosition, "log_bin") {
			t.Fatalf("CountInSnapshot = %+v, want 2 with no position because the binary log is off", sc)
		}
	}
	// Errors still come back as errors.
	if _, err := m.CountInSnapshot(context.Background(), "SELEC nope", nil, SnapshotOptions{}); err == nil {
		t.Fatal("bad query succeeded")
	}
}

func TestCountInSnapshotErrorsKeepPoolClean(t *testing.T) {
	b := newBinlogDB(t)
	b.insert(4)
	db, err := sql.Open("mysql", b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// One connection: a transaction left open would show on the next use.
	m := NewMySQL(db, DBConfig{MaxOpenConns: 1, QueryTimeout: 300 * time.Millisecond}, nil)
	for _, q := range []string{"SELECT COUNT(*), 1 FROM comments WHERE post_id = ?", "SELEC nope ?", "SELECT SLEEP(0.8) FROM comments WHERE post_id = ?"} {
		if _, err := m.CountInSnapshot(context.Background(), q, []rules.Value{intValue("4")}, SnapshotOptions{}); err == nil {
			t.Fatalf("%q succeeded", q)
		}
		var inTx int
		if err := db.QueryRow("SELECT @@in_transaction").Scan(&inTx); err != nil || inTx != 0 {
			t.Fatalf("after %q: @@in_transaction = %d, %v; want 0", q, inTx, err)
		}
		sc, err := m.CountInSnapshot(context.Background(), commentsQuery, []rules.Value{intValue("4")}, SnapshotOptions{})
		if err != nil || sc.N != 1 || !sc.At.Known() {
			t.Fatalf("after %q: CountInSnapshot = %+v, %v", q, sc, err)
		}
	}
}

// snapshotSessions counts the sessions of db's user on b's database,
// less the one asking.
func (b *binlogDB) snapshotSessions() (ids []int64) {
	b.t.Helper()
	rows, err := b.conn.QueryContext(context.Background(),
		"SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> CONNECTION_ID()")
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			b.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestCountInSnapshotKeepsConnections runs recounts from several
// goroutines: they share the connections kept for snapshots (half the
// pool) and leave the rest of the pool to plain queries, which go on
// while the kept connections wait idle.
func TestCountInSnapshotKeepsConnections(t *testing.T) {
	b := newBinlogDB(t)
	b.insert(4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 25 {
				sc, err := b.m.CountInSnapshot(context.Background(), commentsQuery, []rules.Value{intValue("4")}, SnapshotOptions{})
				if err != nil || sc.N != 1 || !sc.At.Known() {
					t.Errorf("CountInSnapshot = %+v, %v", sc, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := b.m.SnapshotsTaken(); n >= 100 {
		t.Errorf("%d snapshots for 100 recounts asked 4 at a time: none shared", n)
	}
	// MaxOpenConns 4: two kept for snapshots.
	if ids := b.snapshotSessions(); len(ids) > 2 {
		t.Fatalf("%d other sessions after 100 recounts, want at most the 2 kept for snapshots", len(ids))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if n, err := b.m.Count(ctx, commentsQuery, []rules.Value{intValue("4")}); err != nil || n != 1 {
		t.Fatalf("plain Count beside the kept connections = %d, %v", n, err)
	}
}

// TestCountInSnapshotConnectionKilledWhileIdle kills the kept connection
// between two recounts, as a server's wait_timeout or a proxy would: the
// second recount goes on a new connection instead of failing.
func TestCountInSnapshotConnectionKilledWhileIdle(t *testing.T) {
	b := newBinlogDB(t)
	b.insert(4)
	m := NewMySQL(b.db, DBConfig{MaxOpenConns: 3}, slog.New(slog.DiscardHandler)) // one kept connection
	if _, err := m.CountInSnapshot(context.Background(), commentsQuery, []rules.Value{intValue("4")}, SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	ids := b.snapshotSessions()
	if len(ids) != 1 {
		t.Fatalf("%d other sessions, want the one kept", len(ids))
	}
	if _, err := b.conn.ExecContext(context.Background(), "KILL CONNECTION "+strconv.FormatInt(ids[0], 10)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	b.insert(4)
	sc, err := m.CountInSnapshot(context.Background(), commentsQuery, []rules.Value{intValue("4")}, SnapshotOptions{})
	if err != nil || sc.N != 2 || !sc.At.Known() {
		t.Fatalf("after the kill: CountInSnapshot = %+v, %v", sc, err)
	}
}
