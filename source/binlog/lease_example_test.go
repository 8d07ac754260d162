package binlog_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"

	_ "github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/source/binlog"
)

// An instance waits as a standby, takes the checkpoint over once active,
// checks Held before each write batch and saves positions until it loses
// the lease or is fenced.
func Example_leaseAndCheckpoint() {
	ctx := context.Background()
	log := slog.Default()
	db, err := sql.Open("mysql", "cachewarden@tcp(db.example:3306)/")
	if err != nil {
		return
	}
	lease, err := binlog.NewLease(db, binlog.LeaseConfig{Name: "orders"}, log)
	if err != nil {
		return
	}
	cp, err := binlog.OpenCheckpoint(ctx, db, binlog.CheckpointConfig{Database: "cachewarden", Name: "orders"}, log)
	if err != nil {
		return
	}
	skipDB, skipTable := cp.Table() // the stream skips the checkpoint's own events
	_, _ = skipDB, skipTable
	if err := lease.Acquire(ctx); err != nil {
		return
	}
	_, position, err := cp.Acquire(ctx)
	if err != nil {
		lease.Release(ctx)
		return
	}
	_ = position // resume the stream here; "" means from the start
	active, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		err := lease.Keep(active) // returns ErrLeaseLost when lost
		_ = err
		stop()
	}()
	for active.Err() == nil {
		// ... read a batch of changes ...
		if ok, _ := lease.Held(); !ok {
			break // the lease may have passed: write nothing
		}
		// ... write the batch to memcached ...
		if err := cp.Save(ctx, "0-1-42"); errors.Is(err, binlog.ErrFenced) {
			break // a newer instance owns the checkpoint
		}
	}
}
