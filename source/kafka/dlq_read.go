package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// DeadLetter is one record of the dead-letter topic as DLQ.Send wrote it
// (docs/operations.md, "Dead-letter topic"), read back by ReadDLQ.
type DeadLetter struct {
	// Partition and Offset locate the record in the dead-letter topic.
	Partition int
	Offset    int64
	// Written is when the dead letter was written (the record's own
	// timestamp).
	Written time.Time
	// Origin is where the original record is (HeaderTopic,
	// HeaderPartition, HeaderOffset); Origin.Topic is "" when the
	// headers name none.
	Origin PartitionOffset
	// EndOffset is, for the dead letter of a batch too large to
	// decompress (HeaderEndOffset), the offset after the batch's last
	// record, Origin.Offset being its first; -1 otherwise.
	EndOffset int64
	// Time is the original record's timestamp (HeaderTimestamp); zero
	// when the header is absent.
	Time time.Time
	// Reason is why the message is poison (HeaderError).
	Reason string
	// Size is the size of the original value in bytes: the dropped one's
	// when ValueDropped.
	Size int
	// ValueDropped is true for a dead letter written without its value
	// because the brokers refused it as too large (HeaderValueDropped).
	ValueDropped bool
	// Problem says which cachewarden header could not be read; "" when
	// every one could. A dead letter with a problem is listed, not
	// re-driven.
	Problem string
	// Message is the original message: key, value and headers (those of
	// the original record, without the cachewarden.* ones DLQ.Send
	// added), original timestamp and origin. Its memory is its own.
	Message pipeline.Message
}

// headerPrefix starts every header DLQ.Send adds.
const headerPrefix = "cachewarden."

// ParseDeadLetter reads a dead-letter record. Headers that cannot be read
// are named in DeadLetter.Problem; it never fails.
func ParseDeadLetter(r *kgo.Record) DeadLetter {
	d := DeadLetter{Partition: int(r.Partition), Offset: r.Offset, Written: r.Timestamp, EndOffset: -1, Size: len(r.Value)}
	var problems []string
	num := func(key, v string, bits int) int64 {
		n, err := strconv.ParseInt(v, 10, bits)
		if err != nil || n < 0 {
			problems = append(problems, fmt.Sprintf("header %s %q is not a number from 0", key, truncate(v, 40)))
			return -1
		}
		return n
	}
	m := pipeline.Message{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value)}
	var hasPartition, hasOffset bool
	for _, h := range r.Headers {
		if !strings.HasPrefix(h.Key, headerPrefix) {
			m.Headers = append(m.Headers, pipeline.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
			continue
		}
		v := string(h.Value)
		switch h.Key {
		case HeaderError:
			d.Reason = v
		case HeaderTopic:
			if err := checkTopic(v); err != nil {
				problems = append(problems, "header "+HeaderTopic+": "+err.Error())
			} else {
				d.Origin.Topic = v
			}
		case HeaderPartition:
			d.Origin.Partition, hasPartition = int(num(h.Key, v, 32)), true
		case HeaderOffset:
			d.Origin.Offset, hasOffset = num(h.Key, v, 64), true
		case HeaderEndOffset:
			d.EndOffset = num(h.Key, v, 64)
		case HeaderTimestamp:
			if ms := num(h.Key, v, 64); ms >= 0 {
				d.Time = time.UnixMilli(ms)
			}
		case HeaderValueDropped:
			d.ValueDropped = true
			d.Size = int(num(h.Key, v, 32))
		}
	}
	if d.Origin.Topic != "" && (!hasPartition || !hasOffset) {
		problems = append(problems, "headers name the original topic without its partition and offset")
	}
	d.Problem = strings.Join(problems, "; ")
	m.Time = d.Time
	m.Pos = rules.Position{Topic: d.Origin.Topic, Partition: d.Origin.Partition, Offset: d.Origin.Offset}
	d.Message = m
	return d
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// ErrNotRedrivable is wrapped by DeadLetter.Redrivable's errors.
var ErrNotRedrivable = errors.New("cannot be re-driven")

// Redrivable returns nil when the dead letter holds its original message,
// else why it does not, wrapping ErrNotRedrivable and naming the replay
// that applies the original records instead.
func (d *DeadLetter) Redrivable() error {
	switch {
	case d.Problem != "":
		return fmt.Errorf("%w: %s", ErrNotRedrivable, d.Problem)
	case d.EndOffset >= 0:
		return fmt.Errorf("%w: it marks a record batch too large to decompress, without its records; replay them: cachewarden replay --from %s --to %s",
			ErrNotRedrivable, d.Origin, PartitionOffset{Topic: d.Origin.Topic, Partition: d.Origin.Partition, Offset: d.EndOffset})
	case d.ValueDropped:
		if d.Origin.Topic == "" {
			return fmt.Errorf("%w: it was written without its value (%d bytes), and names no original record", ErrNotRedrivable, d.Size)
		}
		return fmt.Errorf("%w: it was written without its value (%d bytes); replay the original: cachewarden replay --from %s --to %s",
			ErrNotRedrivable, d.Size, d.Origin, PartitionOffset{Topic: d.Origin.Topic, Partition: d.Origin.Partition, Offset: d.Origin.Offset + 1})
	}
	return nil
}

// DLQReadOptions bound a read of the dead-letter topic (ReadDLQ).
type DLQReadOptions struct {
	// Partition is the only partition read; -1 reads every one, in
	// partition order.
	Partition int
	// From is the first offset read in each partition; offsets before
	// the partition's log start are not there any more.
	From int64
	// IdleTimeout is how long a partition may deliver nothing before the
	// offset it had at the start before the read fails; default
	// DefaultReplayIdleTimeout.
	IdleTimeout time.Duration
}

// ErrStopDLQ, returned by ReadDLQ's handle, ends the read without an
// error.
var ErrStopDLQ = errors.New("kafka: stop reading the dead-letter topic")

// dlqReadBatch is how many dead letters are fetched before they are
// handed over.
const dlqReadBatch = 500

// ReadDLQ reads the dead-letter topic from its start (or opts.From) to
// the end offsets its partitions have when it is called, so it never
// waits for new dead letters, and hands each one to handle, partition
// after partition, each in offset order. It stops when handle returns an
// error, which it returns (nil for ErrStopDLQ). It reads partitions
// directly (no consumer group, nothing committed).
func ReadDLQ(ctx context.Context, conn KafkaConn, topic string, opts DLQReadOptions, log *slog.Logger, handle func(*DeadLetter) error) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultReplayIdleTimeout
	}
	ranges, err := ResolveReplayRanges(ctx, conn, []string{topic}, ReplayBound{Earliest: true}, ReplayBound{}, log)
	if err != nil {
		return fmt.Errorf("read dead letters of %s: %w", topic, err)
	}
	rr := rangeReading{what: "read", conn: conn, idleTimeout: opts.IdleTimeout, log: log}
	for _, r := range ranges {
		if opts.Partition >= 0 && r.Partition != opts.Partition {
			continue
		}
		r.Start = max(r.Start, opts.From)
		if r.Len() == 0 {
			continue
		}
		err := readRange(ctx, rr, r, dlqReadBatch, func(msgs []pipeline.Message) error {
			for i := range msgs {
				rec := kgo.Record{Key: msgs[i].Key, Value: msgs[i].Value, Headers: recordHeaders(msgs[i].Headers, 0),
					Timestamp: msgs[i].Time, Partition: int32(msgs[i].Pos.Partition), Offset: msgs[i].Pos.Offset}
				d := ParseDeadLetter(&rec)
				if err := handle(&d); err != nil {
					return err
				}
			}
			return nil
		})
		if errors.Is(err, ErrStopDLQ) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}
