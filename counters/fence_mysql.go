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
	mu     sync.Mutex
	why    string
	reason UnfencedReason
	until  time.Time
}

// unsupported returns why positions are unavailable, while that answer is
// fresh.
func (s *snapshotSupport) unsupported(now time.Time) (string, UnfencedReason, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.why == "" || now.After(s.until) {
		return "", 0, false
	}
	return s.why, s.reason, true
}

func (s *snapshotSupport) remember(why string, reason UnfencedReason, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.why, s.reason, s.until = why, reason, now.Add(snapshotRecheck)
}

// UnfencedReason says why a recount could not be fenced; its String is
// the reason label of cachewarden_recount_unfenced_total.
type UnfencedReason uint8

const (
	// UnfencedBinlogOff: the server's binary log is off.
	UnfencedBinlogOff UnfencedReason = iota + 1
	// UnfencedNoSnapshotPosition: the server cannot name a consistent
	// snapshot's binary log position (MySQL without Percona's extension).
	UnfencedNoSnapshotPosition
	// UnfencedStatusUnreadable: reading the snapshot's position failed
	// (a proxy refusing SHOW STATUS, say).
	UnfencedStatusUnreadable
	// UnfencedDisabled: fencing is off (counters.fencing: off).
	UnfencedDisabled
	// UnfencedNoSnapshots: the Recounter cannot count in a snapshot.
	UnfencedNoSnapshots
	nUnfencedReasons
)

// String returns the reason's metric label.
func (r UnfencedReason) String() string {
	switch r {
	case UnfencedBinlogOff:
		return "binlog_off"
	case UnfencedNoSnapshotPosition:
		return "no_snapshot_position"
	case UnfencedStatusUnreadable:
		return "status_unreadable"
	case UnfencedDisabled:
		return "disabled"
	case UnfencedNoSnapshots:
		return "no_snapshots"
	}
	return "unknown"
}

// UnfencedReasons lists every UnfencedReason, for metrics.
func UnfencedReasons() []UnfencedReason {
	out := make([]UnfencedReason, 0, nUnfencedReasons-1)
	for r := UnfencedBinlogOff; r < nUnfencedReasons; r++ {
		out = append(out, r)
	}
	return out
}

// Reasons CountInSnapshot gives for a snapshot without position.
const (
	noPositionBinlogOff = "the binary log is off (log_bin = OFF): nothing to fence at"
	noPositionMySQL     = "the server does not report a consistent snapshot's binary log position (status binlog_snapshot_file/binlog_snapshot_position: MariaDB and Percona Server have it, MySQL does not)"
)

// SnapshotOptions asks CountInSnapshot for more than the count and the
// binary log position.
type SnapshotOptions struct {
	// GTID asks for the snapshot's GTID position as well (SnapshotCount.
	// GTID): on MariaDB BINLOG_GTID_POS of the snapshot's position, which
	// reads the binary log file up to it (milliseconds per hundred MB),
	// so it is asked for only once change events carry GTIDs without
	// positions.
	GTID bool
}

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
func (m *MySQL) CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts SnapshotOptions) (SnapshotCount, error) {
	if why, reason, ok := m.snapshots.unsupported(time.Now()); ok {
		n, err := m.Count(ctx, query, args)
		return SnapshotCount{N: n, NoPosition: why, Unfenced: reason}, err
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
	snap, err := snapshotPosition(ctx, conn, opts)
	if err != nil {
		// The status cannot be read (a proxy refusing SHOW, say): count
		// without a position rather than not at all.
		snap = snapshotAt{why: "cannot read the snapshot's binary log position: " + err.Error(), reason: UnfencedStatusUnreadable}
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
	if !snap.at.Known() {
		m.snapshots.remember(snap.why, snap.reason, time.Now())
		return SnapshotCount{N: n, NoPosition: snap.why, Unfenced: snap.reason}, nil
	}
	return SnapshotCount{N: n, At: snap.at, ServerID: snap.serverID, GTID: snap.gtid}, nil
}

// snapshotAt is what snapshotPosition learned.
type snapshotAt struct {
	at       BinlogPosition
	serverID uint32
	gtid     string
	why      string
	reason   UnfencedReason
}

// snapshotPosition reads the binary log position of the current
// transaction's consistent snapshot, the server's @@server_id, and with
// opts.GTID the snapshot's GTID position; at is zero, and why says why,
// when the server has none.
func snapshotPosition(ctx context.Context, conn *sql.Conn, opts SnapshotOptions) (snapshotAt, error) {
	rows, err := conn.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'binlog\_snapshot\_%'`)
	if err != nil {
		return snapshotAt{}, err
	}
	defer rows.Close()
	var file, pos, gtidExecuted string
	seen := 0
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return snapshotAt{}, err
		}
		switch strings.ToLower(name) {
		case "binlog_snapshot_file":
			file = value
			seen++
		case "binlog_snapshot_position":
			pos = value
			seen++
		case "binlog_snapshot_gtid_executed":
			// Servers that report the snapshot's gtid_executed with it.
			gtidExecuted = value
		}
	}
	if err := rows.Err(); err != nil {
		return snapshotAt{}, err
	}
	rows.Close()
	if seen < 2 {
		return snapshotAt{why: noPositionMySQL, reason: UnfencedNoSnapshotPosition}, nil
	}
	if file == "" {
		return snapshotAt{why: noPositionBinlogOff, reason: UnfencedBinlogOff}, nil
	}
	p, err := strconv.ParseInt(pos, 10, 64)
	if err != nil || p <= 0 {
		return snapshotAt{}, fmt.Errorf("binlog_snapshot_position %q is not a position", pos)
	}
	snap := snapshotAt{at: BinlogPosition{File: file, Pos: p}}
	if err := conn.QueryRowContext(ctx, "SELECT @@server_id").Scan(&snap.serverID); err != nil {
		return snapshotAt{}, fmt.Errorf("read @@server_id: %w", err)
	}
	if _, ok := parseGTIDSet(gtidExecuted); ok {
		snap.gtid = gtidExecuted
	} else if opts.GTID {
		// MariaDB: the GTID position at the snapshot's binary log
		// position, exactly (NULL elsewhere, or when the position is no
		// longer in the log: then no GTID set).
		var g sql.NullString
		if err := conn.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, ?)", file, p).Scan(&g); err == nil && g.Valid {
			if _, ok := parseGTIDSet(g.String); ok {
				snap.gtid = g.String
			}
		}
	}
	return snap, nil
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
