package counters

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

// snapshotRecheck is how long CountInSnapshot trusts that the server
// cannot name a snapshot's position before it asks again (the binary log
// can be turned on by a restart, and a failover may bring another server):
// in between, recounts are plain queries with no transaction overhead.
const snapshotRecheck = time.Minute

// snapshotSupport remembers the last "no position" answer.
type snapshotSupport struct {
	mu    sync.Mutex
	why   string
	until time.Time
}

// unsupported returns why positions are unavailable, while that answer is
// fresh.
func (s *snapshotSupport) unsupported(now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.why == "" || now.After(s.until) {
		return "", false
	}
	return s.why, true
}

func (s *snapshotSupport) remember(why string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.why, s.until = why, now.Add(snapshotRecheck)
}

// Reasons CountInSnapshot gives for a snapshot without position.
const (
	noPositionBinlogOff = "the binary log is off (log_bin = OFF): nothing to fence at"
	noPositionMySQL     = "the server does not report a consistent snapshot's binary log position (status binlog_snapshot_file/binlog_snapshot_position: MariaDB and Percona Server have it, MySQL does not)"
)

// CountInSnapshot runs a recount query (as Count does) inside a consistent
// snapshot, and reports the snapshot's binary log position:
//
//	SET TRANSACTION ISOLATION LEVEL REPEATABLE READ
//	START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY
//	SHOW SESSION STATUS LIKE 'binlog\_snapshot\_%'
//	<query>
//	COMMIT
//
// MariaDB (and Percona Server) report in binlog_snapshot_file and
// binlog_snapshot_position the binary log position that matches the
// snapshot exactly: the transactions logged before it are in the count,
// none after it. The counted tables must be transactional (InnoDB) for the
// snapshot to hold them.
//
// When the server cannot name the position (binary log off, MySQL, which
// has no such status and whose performance_schema.log_status and
// gtid_executed are not tied to a snapshot) the count is still returned,
// with At zero and NoPosition saying why; that answer is then trusted for
// a minute, during which recounts run as plain queries. Safe for
// concurrent use.
func (m *MySQL) CountInSnapshot(ctx context.Context, query string, args []rules.Value) (SnapshotCount, error) {
	if why, ok := m.snapshots.unsupported(time.Now()); ok {
		n, err := m.Count(ctx, query, args)
		return SnapshotCount{N: n, NoPosition: why}, err
	}
	bound, err := bindArgs(args)
	if err != nil {
		return SnapshotCount{}, fmt.Errorf("counters: recount: %w", err)
	}
	ctx, cancel := m.queryContext(ctx)
	defer cancel()
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return SnapshotCount{}, fmt.Errorf("counters: recount: connect: %w", err)
	}
	defer conn.Close()
	// Outside a transaction, for the next one only: a session default of
	// READ COMMITTED would give every statement its own snapshot.
	if _, err := conn.ExecContext(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		return SnapshotCount{}, fmt.Errorf("counters: recount: set isolation level: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		return SnapshotCount{}, fmt.Errorf("counters: recount: start snapshot: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			endTransaction(conn)
		}
	}()
	at, why, err := snapshotPosition(ctx, conn)
	if err != nil {
		// The status cannot be read (a proxy refusing SHOW, say): count
		// without a position rather than not at all.
		why = "cannot read the snapshot's binary log position: " + err.Error()
		m.log.Debug("cannot read binlog_snapshot_position", "err", err)
	}
	n, err := scanCount(conn.QueryContext(ctx, query, bound...))
	if err != nil {
		return SnapshotCount{}, err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return SnapshotCount{}, fmt.Errorf("counters: recount: commit: %w", err)
	}
	committed = true
	if !at.Known() {
		m.snapshots.remember(why, time.Now())
	}
	return SnapshotCount{N: n, At: at, NoPosition: why}, nil
}

// snapshotPosition reads the binary log position of the current
// transaction's consistent snapshot; at is zero, and why says why, when
// the server has none.
func snapshotPosition(ctx context.Context, conn *sql.Conn) (at BinlogPosition, why string, err error) {
	rows, err := conn.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'binlog\_snapshot\_%'`)
	if err != nil {
		return BinlogPosition{}, "", err
	}
	defer rows.Close()
	var file, pos string
	seen := 0
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return BinlogPosition{}, "", err
		}
		switch strings.ToLower(name) {
		case "binlog_snapshot_file":
			file = value
			seen++
		case "binlog_snapshot_position":
			pos = value
			seen++
		}
	}
	if err := rows.Err(); err != nil {
		return BinlogPosition{}, "", err
	}
	if seen < 2 {
		return BinlogPosition{}, noPositionMySQL, nil
	}
	if file == "" {
		return BinlogPosition{}, noPositionBinlogOff, nil
	}
	p, err := strconv.ParseInt(pos, 10, 64)
	if err != nil || p <= 0 {
		return BinlogPosition{}, "", fmt.Errorf("binlog_snapshot_position %q is not a position", pos)
	}
	return BinlogPosition{File: file, Pos: p}, "", nil
}

// endTransaction rolls back an unfinished snapshot transaction; when that
// fails the connection is discarded rather than returned to the pool with
// the transaction open.
func endTransaction(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}
