package binlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// readWhileActive reads and applies from the checkpoint until ctx ends,
// the lease is lost (the write guard refuses) or the checkpoint is
// fenced, which it returns; read errors reopen the stream from the last
// saved position after a backoff.
func (d *Daemon) readWhileActive(ctx context.Context) error {
	_, saved, err := d.ckpt.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("binlog: acquire the checkpoint: %w", err)
	}
	start, err := ParsePosition(saved)
	if err != nil {
		return fmt.Errorf("binlog: checkpoint %s: %w", d.cfg.Checkpoint.Name, err)
	}
	if saved == "" {
		start = d.cfg.Stream.Start // no checkpoint yet: the configured start (zero: the current position)
	}
	takeover := true
	for attempt := 0; ctx.Err() == nil; attempt++ {
		progressed, err := d.readFrom(ctx, &start, takeover)
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrFenced), errors.Is(err, cacheops.ErrWriteRefused):
			return err
		case isPurged(err):
			if start, err = d.onPurged(ctx, start, err); err != nil {
				return err
			}
			continue
		}
		if progressed {
			attempt, takeover = 0, false
		}
		d.setProblem("cannot read the binary log: " + err.Error())
		if retry.Logged(attempt) {
			d.log.Error("binlog: reading failed; reopening from the last checkpoint", "from", FormatPosition(start),
				"attempt", attempt+1, "error", err.Error())
		}
		d.m.reopens.Inc()
		if retry.Sleep(ctx, retry.Backoff(attempt, DefaultRetryMin, DefaultRetryMax)) != nil {
			return nil
		}
	}
	return nil
}

// item is what the stream's reader hands over: a transaction (or part)
// or the error that ended the stream.
type item struct {
	txn *Txn
	err error
}

// readFrom opens a stream at *start (the server's current position when
// zero), applies its transactions in batches and advances *start to
// each saved checkpoint. It reports whether it saved one. recovery
// batches (see recovery) follow every open: their deltas may have been
// applied already.
func (d *Daemon) readFrom(ctx context.Context, start *Start, takeover bool) (bool, error) {
	cfg := d.cfg.Stream
	if start.IsZero() {
		cur, err := currentStart(ctx, d.db, cfg.Flavor)
		if err != nil {
			return false, err
		}
		*start = cur
	}
	cfg.Start = *start
	ckDB, ckTable := d.ckpt.Table()
	// The daemon's own checkpoint writes, and the changes of tables no
	// rule reads (the rules of the moment: a reload may add some), are
	// passed over before their rows are decoded.
	cfg.Skip = func(database, table string) bool {
		return database == ckDB && table == ckTable || !d.p.Rules().Reads(database, table)
	}
	st, err := Open(ctx, cfg, d.db, d.log.With("component", "binlog-stream"))
	if err != nil {
		return false, err
	}
	d.setProblem("")
	rctx, stopReading := context.WithCancel(ctx)
	items := make(chan item, txnQueue)
	done := make(chan struct{})
	go func() { defer close(done); d.readStream(rctx, st, items) }()
	defer func() { stopReading(); st.Close(); <-done }()
	d.log.Info("binlog: reading", "from", FormatPosition(*start))
	return d.applyStream(ctx, items, start, recovery{left: d.cfg.MaxEvents, resetSets: takeover})
}

// readStream hands the stream's transactions to items until it fails or
// ctx ends; the failure is the last item.
func (d *Daemon) readStream(ctx context.Context, st *Stream, items chan<- item) {
	for {
		txn, err := st.Next(ctx)
		select {
		case items <- item{txn, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// recovery is the state of the batches that follow an open of the
// stream: the position they start from may be before changes an earlier
// active (or this one, before a read error) applied without saving, at
// most one batch of complete transactions after the parts of one large
// transaction. Their counter deltas become recounts, and after a
// takeover their set changes deletes of their sets (a frozen previous
// active may still send a token), until MaxEvents row changes after the
// first complete transaction have been applied. This assumes every
// instance uses the same batch.max_events.
type recovery struct {
	// left counts the row changes still to apply in recovery after the
	// first complete transaction; sawComplete tells whether it passed.
	left        int
	sawComplete bool
	resetSets   bool
}

func (r *recovery) on() bool { return !r.sawComplete || r.left > 0 }

// applied records a batch that ended recovery's share.
func (r *recovery) applied(rows int, complete bool) {
	if r.sawComplete {
		r.left -= rows
	}
	if complete {
		r.sawComplete = true
	}
}

// applyStream applies batches of items until the stream fails or ctx
// ends; it saves the position after each batch that completes a
// transaction.
func (d *Daemon) applyStream(ctx context.Context, items <-chan item, start *Start, rec recovery) (bool, error) {
	var (
		b         pipeline.Batch
		msgs      []pipeline.Message
		saved     bool
		streamErr error
	)
	guarded := cacheops.WithGuard(ctx, d.writeGuard)
	for streamErr == nil {
		var end Start
		var rows int
		msgs, end, rows, streamErr = d.fill(ctx, items, msgs[:0])
		// A batch may hold no message: the last part of a transaction
		// whose row count is a multiple of the part size comes empty,
		// and only its end is to be saved.
		if len(msgs) > 0 {
			if d.readsSource(msgs) {
				if err := d.waitVisible(ctx, end); err != nil {
					return saved, err
				}
			}
			opts := pipeline.CoalesceOptions{}
			if rec.on() {
				opts = pipeline.CoalesceOptions{Recount: true, ResetSets: rec.resetSets}
			}
			if err := d.p.Process(guarded, &b, msgs, opts); err != nil {
				return saved, err
			}
			d.observeBatch(msgs)
			b.Release()
		}
		rec.applied(rows, !end.IsZero())
		if end.IsZero() {
			continue
		}
		if err := d.ckpt.Save(ctx, FormatPosition(end)); err != nil {
			return saved, err
		}
		*start, saved = end, true
		d.m.setPosition(end)
		d.setProblem("")
	}
	if streamErr == nil {
		streamErr = ctx.Err()
	}
	return saved, streamErr
}

// fill appends the next batch to msgs: it waits for one transaction,
// then takes those already waiting, up to MaxEvents row changes. end is
// the position after the last complete transaction taken (zero when
// none); err the stream's failure, which ends the stream after the batch.
func (d *Daemon) fill(ctx context.Context, items <-chan item, msgs []pipeline.Message) (_ []pipeline.Message, end Start, rows int, err error) {
	take := func(it item) {
		if it.err != nil {
			err = it.err
			return
		}
		msgs = d.appendTxn(msgs, it.txn)
		rows += len(it.txn.Events) + len(it.txn.Unmapped)
		if it.txn.Complete {
			end = it.txn.End
		}
	}
	select {
	case it := <-items:
		take(it)
	case <-ctx.Done():
		return msgs, end, rows, ctx.Err()
	}
	for err == nil && rows < d.cfg.MaxEvents {
		select {
		case it := <-items:
			take(it)
		default:
			return msgs, end, rows, nil
		}
	}
	return msgs, end, rows, err
}

// appendTxn appends a transaction's row changes as one message, and each
// row that could not be mapped as a failed one, counted and logged.
func (d *Daemon) appendTxn(msgs []pipeline.Message, txn *Txn) []pipeline.Message {
	return appendTxn(msgs, txn, func(u Unmapped) {
		d.m.events.WithLabelValues(u.Database+"."+u.Table, "unmapped").Inc()
		d.log.Warn("binlog: a row change could not be mapped; its table's fallback is bumped",
			"table", u.Database+"."+u.Table, "error", u.Err.Error())
	})
}

// appendTxn appends a transaction's row changes as one message, and each
// row that could not be mapped as a failed one that covers its table
// (pipeline.Message.Failed, Offset -1), after telling unmapped (nil:
// nobody) about it; their Pos is the last change's, else the
// transaction's end. A transaction with neither appends nothing.
func appendTxn(msgs []pipeline.Message, txn *Txn, unmapped func(Unmapped)) []pipeline.Message {
	pos := rules.Position{BinlogFile: txn.End.File, BinlogPos: int64(txn.End.Pos), GTID: txn.GTID, TsMs: txn.TsMs}
	if n := len(txn.Events); n > 0 {
		pos = txn.Events[n-1].Source
		msgs = append(msgs, pipeline.Message{Events: txn.Events, Pos: pos})
	}
	for _, u := range txn.Unmapped {
		if unmapped != nil {
			unmapped(u)
		}
		msgs = append(msgs, pipeline.Message{Pos: pos,
			Failed: &decode.DecodeError{Offset: -1, Reason: u.Err.Error(), Database: u.Database, Table: u.Table}})
	}
	return msgs
}

// observeBatch counts an applied batch's row changes by table, and how
// far behind the source its last change is.
func (d *Daemon) observeBatch(msgs []pipeline.Message) {
	var lastTs int64
	for i := range msgs {
		for j := range msgs[i].Events {
			ev := &msgs[i].Events[j]
			d.m.events.WithLabelValues(ev.Database+"."+ev.Table, "applied").Inc()
			lastTs = max(lastTs, ev.Source.TsMs)
		}
	}
	d.m.transactions.Add(float64(len(msgs)))
	if lastTs > 0 {
		d.m.behind.Set(max(0, time.Since(time.UnixMilli(lastTs)).Seconds()))
	}
}

// isPurged reports whether err is the server's refusal to send a log
// that is no longer there (error 1236).
func isPurged(err error) bool {
	s := err.Error()
	return strings.Contains(s, "ERROR 1236") || strings.Contains(s, "Could not find first log file") ||
		strings.Contains(s, "Could not find GTID state")
}

// onPurged applies the Purged policy to a start position the server no
// longer has: PurgedFail waits (not ready) until ctx ends; PurgedCurrent
// covers every rule table and returns the zero start (the current
// position).
func (d *Daemon) onPurged(ctx context.Context, start Start, cause error) (Start, error) {
	if d.cfg.Purged != PurgedCurrent {
		msg := fmt.Sprintf("position %s of checkpoint %s is no longer in the source's binary log (%v); set binlog.purged: current to go on from the current position, or restore the log (docs/operations.md, \"Binary log source\")",
			FormatPosition(start), d.cfg.Checkpoint.Name, cause)
		d.setProblem(msg)
		d.log.Error("binlog: " + msg)
		<-ctx.Done()
		return start, ctx.Err()
	}
	d.log.Warn("binlog: the checkpoint's position was purged from the source's log; bumping every table's fallback and reading on from the current position",
		"position", FormatPosition(start), "error", cause.Error())
	guarded := cacheops.WithGuard(ctx, d.writeGuard)
	if _, err := d.p.CoverGap(guarded, "", pipeline.LostRetention, rules.Position{}); err != nil {
		return start, err
	}
	return Start{}, nil
}

// readsSource reports whether applying msgs may query the database: some
// rule of a changed table loads a set or recounts a counter. Only then
// must the batch wait until its transactions are visible (waitVisible).
func (d *Daemon) readsSource(msgs []pipeline.Message) bool {
	rs := d.p.Rules()
	for i := range msgs {
		for j := range msgs[i].Events {
			if ev := &msgs[i].Events[j]; rs.Queries(ev.Database, ev.Table) {
				return true
			}
		}
	}
	return false
}
