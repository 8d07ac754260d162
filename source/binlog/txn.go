package binlog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cachewarden/cachewarden/rules"
)

// txnState is the transaction Next is reading.
type txnState struct {
	gtid string
	// tsMs is the time of the transaction's first event, in milliseconds
	// since the Unix epoch.
	tsMs int64
	// begun is true between a BEGIN and the commit.
	begun    bool
	events   []rules.Event
	unmapped []Unmapped
	// parted is true once a part of the transaction was returned: its
	// commit is then returned even with nothing left in it.
	parted bool
	// rows is a row event whose rows from rowsAt on are still to be
	// read (a Txn filled up in its middle); rowsHeader is its header,
	// rowsEnd the position after it.
	rows       *replication.RowsEvent
	rowsAt     int
	rowsHeader *replication.EventHeader
	rowsEnd    uint32
}

// Next returns the next committed transaction with at least one row
// change or unmapped row, or the next part of one (Txn.Complete false).
// It waits for the server within ctx; a broken or silent connection
// (no packet within Config.ReadTimeout) is an error, after which the
// Stream must be closed and opened anew from Position.
func (s *Stream) Next(ctx context.Context) (*Txn, error) {
	for {
		if s.atEnd != nil && s.between() && s.atEnd() {
			return nil, errRangeEnd
		}
		if s.cur.rows != nil {
			if err := s.readRows(ctx); err != nil {
				return nil, err
			}
			if s.full() {
				return s.part(), nil
			}
			continue
		}
		q, err := s.nextEvent(ctx)
		if err != nil {
			return nil, err
		}
		txn, err := s.handle(ctx, q.header, q.event, q.end)
		if err != nil {
			return nil, err
		}
		if _, rotate := q.event.(*replication.RotateEvent); !rotate && q.end > 0 {
			s.pos = q.end
		}
		if txn != nil {
			return txn, nil
		}
		if s.full() {
			return s.part(), nil
		}
	}
}

// queuedEvent is an event to handle: its header, and the position
// after it (for an event of a compressed transaction payload, after the
// payload).
type queuedEvent struct {
	header *replication.EventHeader
	event  replication.Event
	end    uint32
}

// nextEvent returns the next event of a compressed payload being read,
// else the server's next event.
func (s *Stream) nextEvent(ctx context.Context) (queuedEvent, error) {
	if len(s.queue) > 0 {
		q := s.queue[0]
		s.queue = s.queue[1:]
		return q, nil
	}
	ev, err := s.streamer.GetEvent(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return queuedEvent{}, ctx.Err()
		}
		return queuedEvent{}, fmt.Errorf("binlog: read the event after %s:%d: %w", s.file, s.pos, err)
	}
	return queuedEvent{header: ev.Header, event: ev.Event, end: ev.Header.LogPos}, nil
}

// handle takes in one event; end is the position after it (after the
// compressed payload holding it). It returns a transaction when the
// event completes one that has something to return.
func (s *Stream) handle(ctx context.Context, h *replication.EventHeader, ev replication.Event, end uint32) (*Txn, error) {
	defer s.stamp(h)
	switch e := ev.(type) {
	case *replication.RotateEvent:
		s.file, s.pos = string(e.NextLogName), uint32(e.Position)
		if s.done.GTIDSet == "" && !s.cur.begun && s.cur.gtid == "" {
			s.done.File, s.done.Pos = s.file, s.pos
		}
	case *replication.MariadbGTIDEvent:
		s.cur = txnState{gtid: e.GTID.String(), begun: !e.IsStandalone()}
	case *replication.GTIDEvent:
		s.cur = txnState{gtid: mysqlGTID(e)}
	case *replication.GtidTaggedLogEvent:
		s.cur = txnState{gtid: mysqlGTID(&e.GTIDEvent)}
	case *replication.QueryEvent:
		return s.query(h, e, end)
	case *replication.RowsEvent:
		s.cur.rows, s.cur.rowsAt, s.cur.rowsHeader, s.cur.rowsEnd = e, 0, h, end
		s.stamp(h)
		return nil, s.readRows(ctx)
	case *replication.XIDEvent:
		return s.commit(end, e.GSet), nil
	case *replication.TransactionPayloadEvent:
		for _, inner := range e.Events {
			s.queue = append(s.queue, queuedEvent{header: inner.Header, event: inner.Event, end: end})
		}
	}
	return nil, nil
}

// stamp records the time of h as the transaction's when it is the first
// event of one.
func (s *Stream) stamp(h *replication.EventHeader) {
	if s.cur.tsMs == 0 && h != nil && (s.cur.gtid != "" || s.cur.begun || s.cur.rows != nil) {
		s.cur.tsMs = int64(h.Timestamp) * 1000
	}
}

// between reports whether no transaction is being read: the next event
// starts one (or is not part of one).
func (s *Stream) between() bool {
	c := &s.cur
	return c.rows == nil && len(s.queue) == 0 && !c.begun && c.gtid == "" && len(c.events) == 0 && len(c.unmapped) == 0 && !c.parted
}

// mysqlGTID is a MySQL GTID event's "uuid:n" ("" for an anonymous
// transaction, or if unreadable).
func mysqlGTID(e *replication.GTIDEvent) string {
	if e.GNO == 0 {
		return ""
	}
	set, err := e.GTIDNext()
	if err != nil {
		return ""
	}
	return set.String()
}

// query takes in a statement: BEGIN, COMMIT, DDL (which drops cached
// columns), TRUNCATE (a Truncate event per table).
func (s *Stream) query(h *replication.EventHeader, e *replication.QueryEvent, end uint32) (*Txn, error) {
	st := parseStatement(string(e.Query), string(e.Schema))
	switch st.kind {
	case "BEGIN":
		s.cur.begun = true
		return nil, nil
	case "COMMIT", "ROLLBACK":
		// ROLLBACK is logged only when changes to non-transactional
		// tables, which it cannot undo, were logged before it.
		return s.commit(end, e.GSet), nil
	}
	if st.changesColumns() {
		s.log.Debug("binlog: DDL drops cached columns", "statement", st.kind, "tables", len(st.tables), "parsed", st.parsed, "at", fmt.Sprintf("%s:%d", s.file, end))
		s.maps = make(map[uint64]mappedTable)
		if !st.parsed {
			s.columns.forgetAll()
		}
		for _, k := range st.tables {
			s.columns.forget(k)
		}
	}
	if st.kind == "TRUNCATE" {
		s.truncate(h, e, st, end)
	}
	if s.cur.begun {
		return nil, nil
	}
	return s.commit(end, e.GSet), nil
}

// truncate adds a Truncate event for the table st names.
func (s *Stream) truncate(h *replication.EventHeader, e *replication.QueryEvent, st statement, end uint32) {
	if !st.parsed || len(st.tables) == 0 {
		s.cur.unmapped = append(s.cur.unmapped, Unmapped{Database: string(e.Schema),
			Err: fmt.Errorf("binlog: TRUNCATE at %s:%d names no table that can be read: %q", s.file, end, e.Query)})
		return
	}
	for _, k := range st.tables {
		if s.cfg.Skip != nil && s.cfg.Skip(k.db, k.table) {
			continue
		}
		s.cur.events = append(s.cur.events, rules.Event{Database: k.db, Table: k.table,
			Operation: rules.Truncate, Source: s.source(h, end)})
	}
}

// source is the Position of a change logged in the event of header h.
func (s *Stream) source(h *replication.EventHeader, end uint32) rules.Position {
	return rules.Position{BinlogFile: s.file, BinlogPos: int64(end), GTID: s.cur.gtid,
		TsMs: int64(h.Timestamp) * 1000, ServerID: h.ServerID}
}

// full reports whether the transaction being read has MaxEvents changes.
func (s *Stream) full() bool { return len(s.cur.events) >= s.cfg.MaxEvents }

// part returns the changes read so far of an unfinished transaction.
func (s *Stream) part() *Txn {
	t := &Txn{Events: s.cur.events, Unmapped: s.cur.unmapped, GTID: s.cur.gtid, TsMs: s.cur.tsMs}
	s.cur.events, s.cur.unmapped, s.cur.parted = nil, nil, true
	return t
}

// commit ends the transaction being read at position end. It returns it
// when it has something to return; either way Position moves past it.
func (s *Stream) commit(end uint32, gset mysql.GTIDSet) *Txn {
	s.done.File, s.done.Pos = s.file, end
	if gset != nil {
		s.done.GTIDSet = gset.String()
	}
	cur := s.cur
	s.cur = txnState{}
	if len(cur.events) == 0 && len(cur.unmapped) == 0 && !cur.parted && !s.keepEmpty {
		return nil
	}
	for i := range cur.events {
		cur.events[i].Source.BinlogPos = int64(end)
	}
	return &Txn{Events: cur.events, Unmapped: cur.unmapped, Complete: true, GTID: cur.gtid, End: s.done, TsMs: cur.tsMs}
}

// readRows maps the rows of the current row event until it ends or the
// transaction holds MaxEvents changes.
func (s *Stream) readRows(ctx context.Context) error {
	e, h := s.cur.rows, s.cur.rowsHeader
	k := tableKey{string(e.Table.Schema), string(e.Table.Table)}
	if s.cfg.Skip != nil && s.cfg.Skip(k.db, k.table) {
		s.cur.rows = nil
		return nil
	}
	cols, err := s.tableColumns(ctx, e.Table)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			// Kept: the next call reads the rows again.
			return fmt.Errorf("binlog: columns of %s at %s:%d: %w", k, s.file, s.cur.rowsEnd, err)
		}
		s.cur.rows = nil
		s.unmapped(k, fmt.Errorf("%d row(s): %w", len(e.Rows), err))
		return nil
	}
	step := 1
	if e.Type() == replication.EnumRowsEventTypeUpdate {
		step = 2
	}
	for ; s.cur.rowsAt+step <= len(e.Rows); s.cur.rowsAt += step {
		if s.full() {
			return nil
		}
		i := s.cur.rowsAt
		ev, err := s.rowEvent(e, cols, i, step)
		if err != nil {
			s.unmapped(k, err)
			continue
		}
		ev.Database, ev.Table, ev.Source = k.db, k.table, s.source(h, s.cur.rowsEnd)
		s.cur.events = append(s.cur.events, ev)
	}
	if s.cur.rowsAt < len(e.Rows) {
		s.unmapped(k, errors.New("an update row event with an odd number of row images"))
	}
	s.cur.rows = nil
	return nil
}

// unmapped records a change of table k, in the current row event, that
// could not be mapped.
func (s *Stream) unmapped(k tableKey, err error) {
	s.cur.unmapped = append(s.cur.unmapped, Unmapped{Database: k.db, Table: k.table,
		Err: fmt.Errorf("binlog: table %s, row event ending at %s:%d: %w", k, s.file, s.cur.rowsEnd, err)})
}

// rowEvent maps the row (an update: the two rows) at i of e.
func (s *Stream) rowEvent(e *replication.RowsEvent, cols []column, i, step int) (rules.Event, error) {
	var ev rules.Event
	first, err := mapRow(cols, e.Rows[i], e.SkippedColumns[i])
	if err != nil {
		return ev, fmt.Errorf("row %d: %w", i+1, err)
	}
	switch e.Type() {
	case replication.EnumRowsEventTypeInsert:
		ev.Operation, ev.After = rules.Insert, first
	case replication.EnumRowsEventTypeDelete:
		ev.Operation, ev.Before = rules.Delete, first
	case replication.EnumRowsEventTypeUpdate:
		after, err := mapRow(cols, e.Rows[i+1], e.SkippedColumns[i+1])
		if err != nil {
			return ev, fmt.Errorf("row %d (after image): %w", i/2+1, err)
		}
		ev.Operation, ev.Before, ev.After = rules.Update, first, after
	default:
		return ev, fmt.Errorf("row event of unknown type %s", e.Type())
	}
	return ev, nil
}

// mapRow maps one row image.
func mapRow(cols []column, vals []any, skipped []int) (rules.Row, error) {
	if len(vals) != len(cols) {
		return nil, fmt.Errorf("%w: the row has %d values, the table %d known columns", ErrColumnCount, len(vals), len(cols))
	}
	if len(skipped) > 0 {
		names := make([]string, len(skipped))
		for i, c := range skipped {
			names[i] = cols[c].Name
		}
		return nil, fmt.Errorf("the row image lacks column(s) %s: binlog_row_image is not FULL", strings.Join(names, ", "))
	}
	row := make(rules.Row, len(cols))
	for i := range cols {
		v, err := toValue(&cols[i], vals[i])
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", cols[i].Name, err)
		}
		row[i] = rules.Column{Name: cols[i].Name, Value: v}
	}
	return row, nil
}

// tableColumns returns the columns of tm, cached per table id and table
// map.
func (s *Stream) tableColumns(ctx context.Context, tm *replication.TableMapEvent) ([]column, error) {
	if m, ok := s.maps[tm.TableID]; ok && m.tm == tm {
		return m.cols, m.err
	}
	cols, err := s.columns.columns(ctx, tm)
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, err
	}
	s.maps[tm.TableID] = mappedTable{tm: tm, cols: cols, err: err}
	return cols, err
}
