package counters

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

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
//	START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY
//	SELECT @@server_id, VARIABLE_NAME, VARIABLE_VALUE
//	  FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME LIKE 'BINLOG\_SNAPSHOT\_%'
//	<query>, <query>, ... (the recounts asked meanwhile)
//	COMMIT
//
// on a connection whose session is REPEATABLE READ and which keeps the
// queries prepared (see snapshotConns). Recounts asked while every
// snapshot connection is busy share the next snapshot (see snapshotAsks):
// reading a snapshot's position costs the server more than a count; the
// recounts of one query that share a snapshot run up to 16 to a
// statement, SELECT (<query>), (<query>), ... (countAsks). A
// server without that status table (MySQL 8) is asked SHOW SESSION STATUS
// and SELECT @@server_id instead.
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
	ctx, cancel := m.queryContext(ctx) // bounds the wait for a snapshot too
	defer cancel()
	ask := &snapshotAsk{query: query, args: bound, gtid: opts.GTID, done: make(chan snapshotAnswer, 1)}
	m.snapAsks.push(ask)
	return m.awaitSnapshot(ctx, ask)
}

// SnapshotQuery is one recount of CountAllInSnapshot: a recount query
// and the values bound to its placeholders.
type SnapshotQuery struct {
	Query string
	Args  []rules.Value
}

// SnapshotBatchCounter is a SnapshotCounter that also takes several
// recounts at once. *MySQL is one; Counters uses it for the recounts of
// one Apply. Implementations must be safe for concurrent use.
type SnapshotBatchCounter interface {
	SnapshotCounter
	// CountAllInSnapshot answers qs as CountInSnapshot answers each
	// (counts[i] and errs[i] for qs[i]), in as few snapshots as it can.
	CountAllInSnapshot(ctx context.Context, qs []SnapshotQuery, opts SnapshotOptions) (counts []SnapshotCount, errs []error)
}

// CountAllInSnapshot runs every recount of qs as CountInSnapshot does, but
// asks for them all at once: the first snapshot connection free takes
// them together (up to 256), so they share one snapshot, whose start
// follows every ask and whose position fences each count. The time limit
// (DBConfig.QueryTimeout) bounds the whole call. Safe for concurrent use.
func (m *MySQL) CountAllInSnapshot(ctx context.Context, qs []SnapshotQuery, opts SnapshotOptions) ([]SnapshotCount, []error) {
	counts := make([]SnapshotCount, len(qs))
	errs := make([]error, len(qs))
	if why, reason, ok := m.snapshots.unsupported(time.Now()); ok {
		for i, q := range qs {
			n, err := m.Count(ctx, q.Query, q.Args)
			counts[i], errs[i] = SnapshotCount{N: n, NoPosition: why, Unfenced: reason}, err
		}
		return counts, errs
	}
	ctx, cancel := m.queryContext(ctx)
	defer cancel()
	asks := make([]*snapshotAsk, len(qs))
	for i, q := range qs {
		bound, err := bindArgs(q.Args)
		if err != nil {
			errs[i] = fmt.Errorf("counters: recount: %w", err)
			continue
		}
		asks[i] = &snapshotAsk{query: q.Query, args: bound, gtid: opts.GTID, done: make(chan snapshotAnswer, 1)}
	}
	m.snapAsks.pushAll(asks)
	for i, a := range asks {
		if a != nil {
			counts[i], errs[i] = m.awaitSnapshot(ctx, a)
		}
	}
	return counts, errs
}

// awaitSnapshot waits for the answer to ask, queued in m.snapAsks: from
// a snapshot under way on another connection, or from one it takes on a
// connection of its own for every ask waiting then.
func (m *MySQL) awaitSnapshot(ctx context.Context, ask *snapshotAsk) (SnapshotCount, error) {
	for {
		c, answer, err := m.snapConns.getOr(ctx, ask.done)
		switch {
		case answer != nil:
			return answer.sc, answer.err
		case err != nil:
			if m.snapAsks.remove(ask) {
				return SnapshotCount{}, fmt.Errorf("counters: recount: %w", err)
			}
			a := <-ask.done // taken by a snapshot under way
			return a.sc, a.err
		}
		asks := m.snapAsks.take()
		if len(asks) == 0 {
			// Ours was taken by a snapshot on another connection.
			m.snapConns.put(c, false)
			a := <-ask.done
			return a.sc, a.err
		}
		for {
			broken, diedIdle := m.countInSnapshot(ctx, c, asks)
			m.snapConns.put(c, broken)
			if !diedIdle {
				break
			}
			// c was closed while idle: the same asks on another
			// connection (a new one once the idle ones are tried).
			if c, _, err = m.snapConns.getOr(ctx, nil); err != nil {
				err = fmt.Errorf("counters: recount: %w", err)
				for _, a := range asks {
					a.answer(SnapshotCount{}, err)
				}
				break
			}
		}
	}
}

// countInSnapshot answers asks with counts in one consistent snapshot on c
// and reports whether c's session is in doubt afterwards. When c turns out
// to have died while idle (diedIdle) it answers none of them.
func (m *MySQL) countInSnapshot(ctx context.Context, c *snapshotConn, asks []*snapshotAsk) (broken, diedIdle bool) {
	// One snapshot answers several callers: none of their contexts alone
	// may cancel it.
	ctx, cancel := m.queryContext(context.WithoutCancel(ctx))
	defer cancel()
	if _, err := c.conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY"); err != nil {
		if c.diedIdle(err) {
			return true, true
		}
		err = fmt.Errorf("counters: recount: start snapshot: %w", err)
		for _, a := range asks {
			a.answer(SnapshotCount{}, err)
		}
		return true, false
	}
	gtid := false
	for _, a := range asks {
		gtid = gtid || a.gtid
	}
	snap, err := m.snapshotPosition(ctx, c.conn, SnapshotOptions{GTID: gtid})
	if err != nil {
		// The status cannot be read (a proxy refusing SHOW, say): count
		// without a position rather than not at all.
		snap = snapshotAt{why: "cannot read the snapshot's binary log position: " + err.Error(), reason: UnfencedStatusUnreadable}
		m.log.Debug("cannot read binlog_snapshot_position", "err", err)
	}
	if !snap.at.Known() {
		m.snapshots.remember(snap.why, snap.reason, time.Now())
	}
	m.snapshotsTaken.Add(1)
	if broken := m.countAsks(ctx, c, asks, snap); broken {
		return true, false
	}
	if _, err := c.conn.ExecContext(ctx, "COMMIT"); err != nil {
		// The counts stand (they were read in the snapshot); the
		// session does not.
		m.log.Debug("recount snapshot: commit failed", "err", err)
		return true, false
	}
	return false, false
}

// combineSizes are how many recounts of one query a snapshot runs in one
// statement, "SELECT (q), (q), ...": one round trip and one statement
// for the server to run instead of several. Each size is prepared once
// per connection and query; a run of asks is cut greedily into them.
var combineSizes = [...]int{16, 4}

// countAsks runs the counts of asks in the snapshot open on c and answers
// them (snap is its position). Asks of one query are combined
// (combineSizes) unless the server refused the combined statement for
// that query before (m.noCombine): a query that cannot be a scalar
// subquery is then run alone. broken reports that c is lost (every ask
// not answered yet is then answered with the error).
func (m *MySQL) countAsks(ctx context.Context, c *snapshotConn, asks []*snapshotAsk, snap snapshotAt) (broken bool) {
	answer := func(a *snapshotAsk, n int64, err error) {
		switch {
		case err != nil:
			a.answer(SnapshotCount{}, err)
		case !snap.at.Known():
			a.answer(SnapshotCount{N: n, NoPosition: snap.why, Unfenced: snap.reason}, nil)
		default:
			a.answer(SnapshotCount{N: n, At: snap.at, ServerID: snap.serverID, GTID: snap.gtid}, nil)
		}
	}
	// The asks by query, in the order of each query's first ask.
	var order []string
	byQuery := make(map[string][]*snapshotAsk)
	for _, a := range asks {
		if _, ok := byQuery[a.query]; !ok {
			order = append(order, a.query)
		}
		byQuery[a.query] = append(byQuery[a.query], a)
	}
	for qi, query := range order {
		group := byQuery[query]
		_, single := m.noCombine.Load(query)
		for len(group) > 0 {
			k := 1
			if !single {
				for _, size := range combineSizes {
					if len(group) >= size {
						k = size
						break
					}
				}
			}
			var (
				ns  []int64
				err error
			)
			if k == 1 {
				var n int64
				n, err = m.countOne(ctx, c, group[0])
				ns = []int64{n}
			} else {
				ns, err = m.countCombined(ctx, c, group[:k])
				if err != nil && !connLost(err) {
					// Not a query that reads as a scalar subquery (or
					// one the server refuses combined): alone from now
					// on.
					m.log.Debug("recount query cannot be combined; running it alone", "err", err)
					m.noCombine.Store(query, true)
					single = true
					continue
				}
			}
			if err != nil && connLost(err) {
				// Neither these counts nor the rest can run on c.
				for _, q := range order[qi:] {
					rest := byQuery[q]
					if q == query {
						rest = group
					}
					for _, a := range rest {
						a.answer(SnapshotCount{}, err)
					}
				}
				return true
			}
			for i, a := range group[:k] {
				if err != nil {
					answer(a, 0, err)
				} else {
					answer(a, ns[i], nil)
				}
			}
			group = group[k:]
		}
	}
	return false
}

// countOne runs one ask's query on c.
func (m *MySQL) countOne(ctx context.Context, c *snapshotConn, a *snapshotAsk) (int64, error) {
	stmt, err := c.stmt(ctx, a.query)
	if err != nil {
		return 0, fmt.Errorf("counters: recount query: prepare: %w", err)
	}
	return scanCount(stmt.QueryContext(ctx, a.args...))
}

// countCombined runs the queries of asks (all the same) as one statement
// on c, "SELECT (q), (q), ...", and returns their counts in order.
func (m *MySQL) countCombined(ctx context.Context, c *snapshotConn, asks []*snapshotAsk) ([]int64, error) {
	var b strings.Builder
	b.WriteString("SELECT ")
	var args []any
	for i, a := range asks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(")
		b.WriteString(a.query)
		b.WriteString(")")
		args = append(args, a.args...)
	}
	stmt, err := c.stmt(ctx, b.String())
	if err != nil {
		return nil, fmt.Errorf("counters: recount query: prepare %d together: %w", len(asks), err)
	}
	rows, err := stmt.QueryContext(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("counters: recount query, %d together: %w", len(asks), err)
	}
	defer rows.Close()
	raw := make([]sql.RawBytes, len(asks))
	dst := make([]any, len(asks))
	for i := range raw {
		dst[i] = &raw[i]
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("counters: recount query, %d together: %w", len(asks), err)
		}
		return nil, fmt.Errorf("counters: recount query, %d together, returned no row", len(asks))
	}
	if err := rows.Scan(dst...); err != nil {
		return nil, fmt.Errorf("counters: recount query, %d together: %w", len(asks), err)
	}
	ns := make([]int64, len(asks))
	for i := range raw {
		if ns[i], err = parseCount(raw[i]); err != nil {
			return nil, err
		}
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("counters: recount query, %d together: %w", len(asks), err)
	}
	return ns, nil
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
func (m *MySQL) snapshotPosition(ctx context.Context, conn *sql.Conn, opts SnapshotOptions) (snapshotAt, error) {
	st, err := m.snapshotStatus(ctx, conn)
	if err != nil {
		return snapshotAt{}, err
	}
	if !st.complete {
		return snapshotAt{why: noPositionMySQL, reason: UnfencedNoSnapshotPosition}, nil
	}
	if st.file == "" {
		return snapshotAt{why: noPositionBinlogOff, reason: UnfencedBinlogOff}, nil
	}
	p, err := strconv.ParseInt(st.pos, 10, 64)
	if err != nil || p <= 0 {
		return snapshotAt{}, fmt.Errorf("binlog_snapshot_position %q is not a position", st.pos)
	}
	snap := snapshotAt{at: BinlogPosition{File: st.file, Pos: p}}
	if st.serverID.Valid {
		snap.serverID = uint32(st.serverID.Int64)
	} else if err := conn.QueryRowContext(ctx, "SELECT @@server_id").Scan(&snap.serverID); err != nil {
		return snapshotAt{}, fmt.Errorf("read @@server_id: %w", err)
	}
	if _, ok := parseGTIDSet(st.gtidExecuted); ok {
		snap.gtid = st.gtidExecuted
	} else if opts.GTID {
		// MariaDB: the GTID position at the snapshot's binary log
		// position, exactly (NULL elsewhere, or when the position is no
		// longer in the log: then no GTID set).
		var g sql.NullString
		if err := conn.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, ?)", st.file, p).Scan(&g); err == nil && g.Valid {
			if _, ok := parseGTIDSet(g.String); ok {
				snap.gtid = g.String
			}
		}
	}
	return snap, nil
}

// snapshotVars are the status variables of the current transaction's
// snapshot, as the server reports them.
type snapshotVars struct {
	file, pos string
	// gtidExecuted: servers that report the snapshot's gtid_executed
	// with it.
	gtidExecuted string
	// complete: both file and position were reported.
	complete bool
	// serverID is @@server_id when read with the variables
	// (information_schema).
	serverID sql.NullInt64
}

// snapshotStatus reads the snapshot's status variables; its rows are
// closed when it returns, so conn may run the next statement.
func (m *MySQL) snapshotStatus(ctx context.Context, conn *sql.Conn) (snapshotVars, error) {
	rows, statusTable, err := m.querySnapshotStatus(ctx, conn)
	if err != nil {
		return snapshotVars{}, err
	}
	defer rows.Close()
	var st snapshotVars
	seen := 0
	for rows.Next() {
		var name, value string
		if statusTable {
			err = rows.Scan(&st.serverID, &name, &value)
		} else {
			err = rows.Scan(&name, &value)
		}
		if err != nil {
			return snapshotVars{}, err
		}
		switch strings.ToLower(name) {
		case "binlog_snapshot_file":
			st.file = value
			seen++
		case "binlog_snapshot_position":
			st.pos = value
			seen++
		case "binlog_snapshot_gtid_executed":
			st.gtidExecuted = value
		}
	}
	if err := rows.Err(); err != nil {
		return snapshotVars{}, err
	}
	st.complete = seen >= 2
	return st, nil
}

// querySnapshotStatus asks for the snapshot's status variables:
// information_schema.SESSION_STATUS with @@server_id (statusTable), or
// SHOW SESSION STATUS where that table does not exist (MySQL 8, which is
// then asked with SHOW from now on).
func (m *MySQL) querySnapshotStatus(ctx context.Context, conn *sql.Conn) (rows *sql.Rows, statusTable bool, err error) {
	if !m.noStatusTable.Load() {
		rows, err = conn.QueryContext(ctx, `SELECT @@server_id, VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME LIKE 'BINLOG\_SNAPSHOT\_%'`)
		var refused *mysql.MySQLError
		if !errors.As(err, &refused) {
			return rows, true, err
		}
		// MySQL 8 has no information_schema.SESSION_STATUS (its status
		// is in performance_schema, without a snapshot's position).
		m.noStatusTable.Store(true)
	}
	rows, err = conn.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'binlog\_snapshot\_%'`)
	return rows, false, err
}
