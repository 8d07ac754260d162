package main

import (
	"fmt"
	"time"

	"github.com/cachewarden/cachewarden/source/binlog"
	"github.com/cachewarden/cachewarden/source/kafka"
)

// The forms --from and --to accept, for their error messages.
const (
	replayStartForms = `--from takes "earliest", an RFC 3339 time such as 2026-05-01T12:00:00Z (or 2026-05-01T12:00:00+02:00), or topic:partition:offset[,topic:partition:offset...]`
	replayEndForms   = `--to takes an RFC 3339 time such as 2026-05-01T12:00:00Z (or 2026-05-01T12:00:00+02:00), or topic:partition:offset[,topic:partition:offset...]`
)

// checkReplayStart reports a --from time after now: no message can have
// been written there yet, so the range is empty.
func checkReplayStart(from kafka.ReplayBound, now time.Time) error {
	if !from.Time.IsZero() && from.Time.After(now) {
		return fmt.Errorf("--from %s is in the future (now %s): no message is there to replay", from, now.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkReplayOrder reports a range that selects nothing because its end
// is not after its start: two times, or the two offsets of one partition.
// Ranges whose order only the broker knows (a time and offsets) pass.
func checkReplayOrder(from, to kafka.ReplayBound) error {
	if !from.Time.IsZero() && !to.Time.IsZero() && !to.Time.After(from.Time) {
		return fmt.Errorf("--to %s is not after --from %s: the range [from, to) is empty", to, from)
	}
	for _, s := range from.Offsets {
		for _, e := range to.Offsets {
			if s.Topic == e.Topic && s.Partition == e.Partition && e.Offset <= s.Offset {
				return fmt.Errorf("--to %s is not after --from %s: the range [from, to) of %s:%d is empty", e, s, s.Topic, s.Partition)
			}
		}
	}
	return nil
}

// The forms --from and --to accept with the binary log source.
const (
	binlogStartForms = `with source binlog --from takes "earliest" (the oldest binary log the server has), gtid:SET (the transactions not in SET), file:NAME:POS (from that position), or an RFC 3339 time such as 2026-05-01T12:00:00Z`
	binlogEndForms   = `with source binlog --to takes gtid:SET (no transaction outside SET), file:NAME:POS (no transaction that ends after it), or an RFC 3339 time such as 2026-05-01T12:00:00Z (default: the server's position when the replay starts)`
)

// parseBinlogBounds sets binFrom and binTo from --from and --to in the
// binary log source's forms; --sets append has no binary log form.
func (o *replayOptions) parseBinlogBounds() error {
	if o.setAppend && !o.dryRun {
		return usageErrorf("replay: --sets append is for the Kafka source; with source binlog the sets are rebuilt (drop --sets append)")
	}
	if o.file != "" || o.fromFlag == "" {
		return nil
	}
	var err error
	if o.binFrom, err = binlog.ParseBound(o.fromFlag); err != nil {
		return usageErrorf("replay: --from: %v; %s", err, binlogStartForms)
	}
	if t := o.binFrom.Time; !t.IsZero() && t.After(time.Now()) {
		return usageErrorf("replay: --from %s is in the future (now %s): no transaction is there to replay", o.binFrom, time.Now().UTC().Format(time.RFC3339))
	}
	if o.toFlag == "" {
		return nil
	}
	if o.binTo, err = binlog.ParseBound(o.toFlag); err != nil {
		return usageErrorf("replay: --to: %v; %s", err, binlogEndForms)
	}
	if o.binTo.Earliest {
		return usageErrorf("replay: --to: earliest is not an end; %s", binlogEndForms)
	}
	if f, t := o.binFrom.Time, o.binTo.Time; !f.IsZero() && !t.IsZero() && !t.After(f) {
		return usageErrorf("replay: --to %s is not after --from %s: the range [from, to) is empty", o.binTo, o.binFrom)
	}
	return nil
}

// checkBinlogFlags refuses, with source binlog, the flags only the Kafka
// source has.
func (o *replayOptions) checkBinlogFlags() error {
	switch {
	case o.file != "":
		return nil
	case o.topicsFlag != "":
		return usageErrorf("replay: --topics names Kafka topics; with source binlog the binary log is replayed (drop --topics)")
	case o.dryRun:
		return usageErrorf("replay: --dry-run replays Kafka or a --file; with source binlog it is not supported (use cachewarden plan on a file of the changes)")
	}
	return nil
}
