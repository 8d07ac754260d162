package binlog

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/itemformat"
)

// DefaultVisibleTimeout bounds how long a batch waits for its
// transactions to become visible to the source's readers (waitVisible).
const DefaultVisibleTimeout = 5 * time.Second

// waitVisible waits until a new consistent snapshot of the source server
// includes every transaction up to end, before the batch that ends there
// is applied. The server sends a transaction to replicas once it is in
// the binary log, which can be before its storage engine commit is
// visible to other sessions; a recount or set load made for the batch
// in that moment would read the database without the very change it
// applies, and lose it. MariaDB (and Percona Server) report the binary
// log position of a consistent snapshot (binlog_snapshot_file and
// _position); on a server that does not, or when end has no file, it
// returns at once. After DefaultVisibleTimeout it logs and returns: the
// batch is applied anyway.
func (d *Daemon) waitVisible(ctx context.Context, end Start) error {
	if end.File == "" || d.noSnapshotPos.Load() {
		return nil
	}
	want := itemformat.BinlogPosition{File: end.File, Pos: int64(end.Pos)}
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("binlog: wait for the batch to be visible: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(DefaultVisibleTimeout)
	for attempt := 0; ; attempt++ {
		at, ok, err := snapshotPosition(ctx, conn)
		switch {
		case err != nil:
			return fmt.Errorf("binlog: wait for the batch to be visible: %w", err)
		case !ok:
			d.noSnapshotPos.Store(true)
			d.log.Info("binlog: the source reports no consistent snapshot position; batches are applied without waiting for their commits to be visible")
			return nil
		}
		if order, comparable := itemformat.ComparePositions(at, want); !comparable || order >= 0 {
			return nil
		}
		if time.Now().After(deadline) {
			d.log.Warn("binlog: the batch's transactions are not visible to readers yet; applying it anyway",
				"end", FormatPosition(end), "snapshot", fmt.Sprintf("%s:%d", at.File, at.Pos))
			return nil
		}
		if err := retry.Sleep(ctx, retry.Backoff(attempt, time.Millisecond, 50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// snapshotPosition opens a consistent snapshot on conn and returns the
// binary log position it matches; ok is false when the server does not
// report one.
func snapshotPosition(ctx context.Context, conn *sql.Conn) (pos itemformat.BinlogPosition, ok bool, err error) {
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
		return pos, false, err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "COMMIT")
	rows, err := conn.QueryContext(ctx, "SHOW STATUS LIKE 'binlog_snapshot_%'")
	if err != nil {
		return pos, false, err
	}
	defer rows.Close()
	var file, offset string
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return pos, false, err
		}
		switch name {
		case "Binlog_snapshot_file", "binlog_snapshot_file":
			file = value
		case "Binlog_snapshot_position", "binlog_snapshot_position":
			offset = value
		}
	}
	if err := rows.Err(); err != nil {
		return pos, false, err
	}
	n, perr := strconv.ParseInt(offset, 10, 64)
	if file == "" || perr != nil {
		return pos, false, nil
	}
	return itemformat.BinlogPosition{File: file, Pos: n}, true, nil
}
