package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/rules"
)

// Partition reader settings.
const (
	// readerMaxWait is how long one fetch waits on the broker for new
	// messages; short, so that shutdown and rebalances are prompt.
	readerMaxWait = time.Second
	// readerMaxBytes bounds one fetch response.
	readerMaxBytes = 16 << 20
	// readerQueue is how many fetched messages wait for the batcher.
	readerQueue = 1000
)

// consumePartition reads one assigned partition in order until ctx ends
// (shutdown or the end of the generation) or reading or committing fails,
// which ends the generation so that the group starts over.
func (d *Daemon) consumePartition(ctx context.Context, gen *kafka.Generation, topic string, pa kafka.PartitionAssignment) {
	log := d.log.With("topic", topic, "partition", pa.ID)
	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        d.cfg.Kafka.Brokers,
		Topic:          topic,
		Partition:      pa.ID,
		Dialer:         d.cfg.Kafka.Dialer(),
		MinBytes:       1,
		MaxBytes:       readerMaxBytes,
		MaxWait:        readerMaxWait,
		QueueCapacity:  min(readerQueue, d.cfg.MaxEvents),
		IsolationLevel: kafka.ReadCommitted,
		ErrorLogger:    kafkaLogger(log, "partition reader"),
	})
	defer reader.Close()
	defer d.m.forgetPartition(topic, pa.ID)
	if err := reader.SetOffset(pa.Offset); err != nil {
		log.Error("cannot start reading partition", "offset", pa.Offset, "error", err.Error())
		d.m.partitionErrors.Inc()
		return
	}
	log.Debug("partition assigned", "offset", pa.Offset)

	var (
		b    Batch
		msgs = make([]Message, 0, d.cfg.MaxEvents)
		// taken is when the previous batch was closed: messages fetched
		// since then have waited for this one.
		taken = time.Now()
		// committed receives the outcome of the previous batch's commit,
		// which runs while the next batch fills; nil when none is under
		// way.
		committed chan error
	)
	// waitCommit waits for the commit under way, if any, and reports
	// whether the partition may go on.
	waitCommit := func() bool {
		if committed == nil {
			return true
		}
		err := <-committed
		committed = nil
		if err != nil {
			if ctx.Err() == nil {
				log.Error("committing offset failed; rejoining the group", "error", err.Error())
				d.m.partitionErrors.Inc()
			}
			return false
		}
		return true
	}
	defer waitCommit()
	for first := true; ; first = false {
		var err error
		msgs, taken, err = d.fill(ctx, reader, msgs[:0], first, taken)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("reading partition failed; rejoining the group", "error", err.Error())
				d.m.partitionErrors.Inc()
			}
			return
		}
		// A batch is applied only after the previous one is committed: at
		// most one batch beyond the committed offset is ever applied,
		// which the first batch of the next owner covers (Config.MaxWait).
		if !waitCommit() {
			return
		}
		// The first batch after an assignment may repeat messages whose
		// counter deltas the previous owner applied without committing.
		if err := d.p.Process(ctx, &b, msgs, CoalesceOptions{Recount: first}); err != nil {
			log.Debug("batch abandoned uncommitted", "messages", len(msgs), "from_offset", msgs[0].Pos.Offset, "reason", err.Error())
			return
		}
		// The commit runs while the next batch fills, so that a slow
		// group coordinator does not hold back the messages behind it.
		next := msgs[len(msgs)-1].Pos.Offset + 1
		committed = make(chan error, 1)
		go func(done chan<- error) {
			if err := d.commit(ctx, gen, topic, pa.ID, next); err != nil {
				done <- fmt.Errorf("offset %d: %w", next, err)
				return
			}
			done <- nil
		}(committed)
		// Messages between the batch's last one and the high watermark of
		// the last fetch response.
		d.m.setLag(topic, pa.ID, reader.Lag())
		clear(msgs) // do not pin message values until the next batch fills
	}
}

// fill appends the next batch of messages to msgs: it waits for one
// message, then takes more until MaxEvents or until MaxWait has passed
// since the first one became available, and returns the batch and when
// it was closed. A first message that was already waiting when fill was
// called counts as available since prevTaken, when the previous batch was
// closed: while that batch was applied and committed, the messages behind
// it have been waiting already, and holding the next batch open for a
// full MaxWait more would add the time of every apply to their latency.
// The first batch after an assignment waits for more instead (see
// Config.MaxWait): until the partition's end as the fetch responses
// report it, MaxEvents, or max(MaxWait, 2s).
func (d *Daemon) fill(ctx context.Context, r *kafka.Reader, msgs []Message, first bool, prevTaken time.Time) ([]Message, time.Time, error) {
	called := time.Now()
	km, err := r.FetchMessage(ctx)
	if err != nil {
		return msgs, time.Now(), err
	}
	msgs = append(msgs, MessageFromKafka(&km))
	if first && caughtUp(&km) {
		return msgs, time.Now(), nil
	}
	opened := time.Now()
	if opened.Sub(called) < waitingThreshold {
		opened = prevTaken // the message was in the reader's queue already
	}
	wait := d.cfg.MaxWait
	if first {
		wait = max(wait, firstBatchWait)
	}
	// At least a quarter of MaxWait remains to take the waiting messages:
	// a batch behind a slow one must not shrink to a few messages (a
	// FetchMessage with an expired context may return without taking a
	// queued message), or the partition would fall further behind.
	bctx, cancel := context.WithDeadline(ctx, later(opened.Add(wait), time.Now().Add(wait/4)))
	defer cancel()
	for len(msgs) < d.cfg.MaxEvents {
		km, err := r.FetchMessage(bctx)
		if err != nil {
			if ctx.Err() != nil {
				return msgs, time.Now(), ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return msgs, time.Now(), nil // the batch's time is up
			}
			return msgs, time.Now(), err
		}
		msgs = append(msgs, MessageFromKafka(&km))
		if first && caughtUp(&km) {
			break
		}
	}
	return msgs, time.Now(), nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// waitingThreshold tells a message that was waiting in the reader's queue
// (FetchMessage returns within microseconds) from one fill had to wait
// for. A slow return misjudged as waiting only keeps the batch open for
// the full MaxWait.
const waitingThreshold = time.Millisecond

// caughtUp reports whether m was the last message of its partition when
// it was fetched.
func caughtUp(m *kafka.Message) bool {
	return m.HighWaterMark > 0 && m.Offset+1 >= m.HighWaterMark
}

// MessageFromKafka converts a fetched Kafka record.
func MessageFromKafka(m *kafka.Message) Message {
	return Message{
		Key:     m.Key,
		Value:   m.Value,
		Headers: m.Headers,
		Time:    m.Time,
		Pos:     rules.Position{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset},
	}
}

// commit commits next as the partition's offset (the offset of the next
// message to read).
func (d *Daemon) commit(ctx context.Context, gen *kafka.Generation, topic string, partition int, next int64) error {
	if err := ctx.Err(); err != nil {
		return err // the generation or the daemon is ending: the batch is redelivered
	}
	start := time.Now()
	err := gen.CommitOffsets(map[string]map[int]int64{topic: {partition: next}})
	d.m.commitDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		d.m.commits.WithLabelValues("error").Inc()
		return err
	}
	d.m.commits.WithLabelValues("ok").Inc()
	return nil
}
