package binlog

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cachewarden/cachewarden/pipeline"
)

// errRangeEnd ends a Stream whose atEnd reported the end of its range.
var errRangeEnd = errors.New("binlog: end of the range")

// Replays read as a replica of their own, with a server id drawn at
// random from ReplayServerIDMin to ReplayServerIDMax (never the
// daemon's binlog.server_id): configure the daemons and the server's
// other replicas with ids below ReplayServerIDMin.
const (
	ReplayServerIDMin uint32 = 1 << 31
	ReplayServerIDMax uint32 = 1<<32 - 1
)

// Bound is one end of a replayed range of the binary log. The zero Bound
// is "none": the oldest log the server has as a start, the server's
// position when the replay starts as an end.
type Bound struct {
	// Pos is a GTID set or a file position. As a start, a GTID set
	// replays the transactions not in it, a file position those from
	// it on; as an end, a GTID set replays no transaction outside it
	// and a file position none that ends after it.
	Pos Start
	// Time, when not zero, is a commit time instead: a start replays
	// from the first transaction that began at or after it, an end
	// stops at the first one that began at or after it. Times are the
	// transactions' event timestamps (whole seconds).
	Time time.Time
	// Earliest, as a start, is the oldest log the server still has.
	Earliest bool
}

// ParseBound reads "earliest", an RFC 3339 time, "gtid:SET" or
// "file:NAME:POS".
func ParseBound(text string) (Bound, error) {
	switch {
	case text == "earliest":
		return Bound{Earliest: true}, nil
	case strings.HasPrefix(text, gtidPrefix), strings.HasPrefix(text, filePrefix):
		s, err := ParsePosition(text)
		if err == nil && s.IsZero() {
			err = fmt.Errorf("position %q names no GTID set or file", text)
		}
		return Bound{Pos: s}, err
	}
	t, err := time.Parse(time.RFC3339, text)
	if err != nil {
		return Bound{}, fmt.Errorf("%q is neither earliest, gtid:SET, file:NAME:POS nor an RFC 3339 time", text)
	}
	return Bound{Time: t}, nil
}

// String renders b as ParseBound reads it ("" for the zero Bound).
func (b Bound) String() string {
	switch {
	case b.Earliest:
		return "earliest"
	case !b.Time.IsZero():
		return b.Time.UTC().Format(time.RFC3339)
	}
	return FormatPosition(b.Pos)
}

// RangeConfig is the range a RangeStream replays and the server it reads.
type RangeConfig struct {
	// Stream is the server and its settings; its ServerID is the
	// daemon's (avoided), its Start and Skip are ignored.
	Stream Config
	// From and To bound the range (see Bound); every range also ends at
	// the server's position when OpenRange is called.
	From, To Bound
	// Tables, when not nil, says which tables' rows are read (those some
	// rule matches); the rows of the others are passed over unmapped.
	// nil reads every table.
	Tables func(database, table string) bool
}

// RangeStream reads a range of a server's binary log as replay messages
// (replay.Stream). Create it with OpenRange; it is read once, by one
// goroutine.
type RangeStream struct {
	cfg    Config
	db     *sql.DB
	log    *slog.Logger
	from   Bound
	to     Bound
	cap    Start // the server's file position when the range was opened
	endSet mysql.GTIDSet
	seen   mysql.GTIDSet
	tables func(database, table string) bool
}

// OpenRange checks the server (as Inspect does) and resolves cfg's bounds
// against it; reading starts in Read. db is a handle on the server.
func OpenRange(ctx context.Context, cfg RangeConfig, db *sql.DB, logger *slog.Logger) (*RangeStream, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.To.Earliest {
		return nil, errors.New("binlog: earliest is a start, not an end")
	}
	r := &RangeStream{cfg: cfg.Stream, db: db, log: logger, from: cfg.From, to: cfg.To, tables: cfg.Tables}
	r.cfg.ServerID = replayServerID(cfg.Stream.ServerID)
	report, err := Inspect(ctx, db, r.cfg.ServerID)
	if err != nil {
		return nil, err
	}
	if len(report.Problems) > 0 {
		return nil, fmt.Errorf("binlog: the source cannot be read: %w", errors.Join(report.Problems...))
	}
	if r.cfg.Flavor == "" {
		r.cfg.Flavor = report.Flavor
	}
	if r.cap, err = currentPosition(ctx, db); err != nil {
		return nil, err
	}
	if s := cfg.To.Pos.GTIDSet; s != "" {
		if r.endSet, err = mysql.ParseGTIDSet(r.cfg.Flavor, s); err != nil {
			return nil, fmt.Errorf("binlog: --to GTID set %q is not a %s GTID set: %w", s, r.cfg.Flavor, err)
		}
	}
	seen := ""
	if cfg.From.Pos.GTIDSet != "" {
		seen = cfg.From.Pos.GTIDSet
	}
	if r.seen, err = mysql.ParseGTIDSet(r.cfg.Flavor, seen); err != nil {
		return nil, fmt.Errorf("binlog: --from GTID set %q is not a %s GTID set: %w", seen, r.cfg.Flavor, err)
	}
	if r.cfg.Start, err = r.start(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// replayServerID draws a server id from ReplayServerIDMin to
// ReplayServerIDMax other than avoid.
func replayServerID(avoid uint32) uint32 {
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		id := binary.BigEndian.Uint32(b[:]) | ReplayServerIDMin
		if id != avoid {
			return id
		}
	}
}

// start is where reading begins: From's position, else the oldest log.
func (r *RangeStream) start(ctx context.Context) (Start, error) {
	if !r.from.Pos.IsZero() {
		return r.from.Pos, nil
	}
	var name string
	rows, err := r.db.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return Start{}, fmt.Errorf("binlog: SHOW BINARY LOGS (the oldest log, where earliest and times start): %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		cols, _ := rows.Columns()
		vals := make([]any, len(cols))
		vals[0] = &name
		for i := 1; i < len(vals); i++ {
			vals[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(vals...); err != nil {
			return Start{}, fmt.Errorf("binlog: read SHOW BINARY LOGS: %w", err)
		}
	}
	if name == "" {
		return Start{}, errors.New("binlog: SHOW BINARY LOGS lists no log")
	}
	return Start{File: name, Pos: 4}, rows.Err()
}

// Len is 0: the number of transactions in the range is not known ahead,
// so progress counts messages.
func (r *RangeStream) Len() int64 { return 0 }

// String names the range.
func (r *RangeStream) String() string {
	to := r.to.String()
	if to == "" {
		to = FormatPosition(r.cap)
	}
	return fmt.Sprintf("binlog %s to %s (server position at start %s)", FormatPosition(r.cfg.Start), to, FormatPosition(r.cap))
}

// Read reads the range and hands batches of whole transactions to
// handle: a batch is handed once it holds maxMessages messages or more
// (a transaction is never split across batches), and at the end.
// progress (nil: nobody) is told how many messages each batch holds.
// Unmapped rows become failed messages (see appendTxn).
func (r *RangeStream) Read(ctx context.Context, maxMessages int, progress func(n int64), handle func([]pipeline.Message) error) error {
	started := r.from.Time.IsZero()
	var st *Stream
	cfg := r.cfg
	// Before a --from time, and of tables not in Tables, rows are
	// passed over unread: a scan from the oldest log maps only what it
	// replays.
	cfg.Skip = func(database, table string) bool {
		if !started && st.cur.tsMs < r.from.Time.UnixMilli() {
			return true
		}
		return r.tables != nil && !r.tables(database, table)
	}
	st, err := Open(ctx, cfg, r.db, r.log)
	if err != nil {
		return err
	}
	defer st.Close()
	st.keepEmpty = true
	st.atEnd = func() bool { return r.reached(st) }
	var msgs []pipeline.Message
	flush := func() error {
		if len(msgs) == 0 {
			return nil
		}
		if err := handle(msgs); err != nil {
			return err
		}
		if progress != nil {
			progress(int64(len(msgs)))
		}
		msgs = nil
		return nil
	}
	inTxn := false
	for {
		txn, err := st.Next(ctx)
		if errors.Is(err, errRangeEnd) {
			return flush()
		}
		if err != nil {
			return fmt.Errorf("binlog: replay %s: %w", r, err)
		}
		if !inTxn { // the first part of a transaction decides
			if !started && txn.TsMs >= r.from.Time.UnixMilli() {
				started = true
			}
			if r.pastEnd(txn) {
				return flush()
			}
		}
		inTxn = !txn.Complete
		if txn.Complete && txn.GTID != "" {
			if err := r.seen.Update(txn.GTID); err != nil {
				return fmt.Errorf("binlog: GTID %q: %w", txn.GTID, err)
			}
		}
		if !started {
			continue
		}
		msgs = appendTxn(msgs, txn, func(u Unmapped) {
			r.log.Warn("binlog: a row change could not be mapped; its table's fallback is bumped",
				"table", u.Database+"."+u.Table, "error", u.Err.Error())
		})
		if txn.Complete && len(msgs) >= maxMessages {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// pastEnd reports whether txn, or the transaction it starts, lies
// after the range's end: it is not replayed and reading stops.
func (r *RangeStream) pastEnd(txn *Txn) bool {
	switch {
	case !r.to.Time.IsZero():
		return txn.TsMs >= r.to.Time.UnixMilli()
	case r.endSet != nil:
		if txn.GTID == "" {
			return false
		}
		g, err := mysql.ParseGTIDSet(r.cfg.Flavor, txn.GTID)
		return err != nil || !r.endSet.Contain(g)
	case r.to.Pos.File != "":
		return txn.Complete && comparePos(txn.End.File, txn.End.Pos, r.to.Pos.File, r.to.Pos.Pos) > 0
	}
	return false
}

// reached reports, between transactions, whether st has read the whole
// range: it is at or past the file position ending it (To's, else the
// server's at the start, whichever comes first), or has seen every transaction of To's GTID
// set.
func (r *RangeStream) reached(st *Stream) bool {
	if r.endSet != nil && r.seen.Contain(r.endSet) {
		return true
	}
	end := r.cap
	if t := r.to.Pos; t.File != "" && comparePos(t.File, t.Pos, end.File, end.Pos) < 0 {
		end = t
	}
	return st.file != "" && comparePos(st.file, st.pos, end.File, end.Pos) >= 0
}

// comparePos orders two file positions: by the files' numeric suffixes
// (mysql-bin.000010 after mysql-bin.000009), then by position.
func comparePos(fileA string, posA uint32, fileB string, posB uint32) int {
	if c := compareFiles(fileA, fileB); c != 0 {
		return c
	}
	switch {
	case posA < posB:
		return -1
	case posA > posB:
		return 1
	}
	return 0
}

func compareFiles(a, b string) int {
	ba, na := splitLogName(a)
	bb, nb := splitLogName(b)
	if ba == bb && na >= 0 && nb >= 0 {
		switch {
		case na < nb:
			return -1
		case na > nb:
			return 1
		}
		return 0
	}
	return strings.Compare(a, b)
}

// splitLogName splits "mysql-bin.000003" into "mysql-bin" and 3 (-1 when
// the name has no numeric suffix).
func splitLogName(name string) (string, int64) {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return name, -1
	}
	n, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil {
		return name, -1
	}
	return name[:i], n
}
