package consumer

import (
	"context"
	"errors"
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
	)
	for first := true; ; first = false {
		var err error
		msgs, err = d.fill(ctx, reader, msgs[:0], first)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("reading partition failed; rejoining the group", "error", err.Error())
				d.m.partitionErrors.Inc()
			}
			return
		}
		// The first batch after an assignment may repeat messages whose
		// counter deltas the previous owner applied without committing.
		if err := d.p.Process(ctx, &b, msgs, CoalesceOptions{Recount: first}); err != nil {
			log.Debug("batch abandoned uncommitted", "messages", len(msgs), "from_offset", msgs[0].Pos.Offset, "reason", err.Error())
			return
		}
		last := msgs[len(msgs)-1].Pos.Offset
		if err := d.commit(ctx, gen, topic, pa.ID, last+1); err != nil {
			if ctx.Err() == nil {
				log.Error("committing offset failed; rejoining the group", "offset", last+1, "error", err.Error())
				d.m.partitionErrors.Inc()
			}
			return
		}
		// Messages between the batch's last one and the high watermark of
		// the last fetch response.
		d.m.setLag(topic, pa.ID, reader.Lag())
		clear(msgs) // do not pin message values until the next batch fills
	}
}

// fill appends the next batch of messages to msgs: it waits for one
// message, then takes more until MaxEvents or until MaxWait has passed
// since the first. The first batch after an assignment waits for more
// instead (see Config.MaxWait): until the partition's end as the fetch
// responses report it, MaxEvents, or max(MaxWait, 2s).
func (d *Daemon) fill(ctx context.Context, r *kafka.Reader, msgs []Message, first bool) ([]Message, error) {
	km, err := r.FetchMessage(ctx)
	if err != nil {
		return msgs, err
	}
	msgs = append(msgs, MessageFromKafka(&km))
	if first && caughtUp(&km) {
		return msgs, nil
	}
	wait := d.cfg.MaxWait
	if first {
		wait = max(wait, firstBatchWait)
	}
	bctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for len(msgs) < d.cfg.MaxEvents {
		km, err := r.FetchMessage(bctx)
		if err != nil {
			if ctx.Err() != nil {
				return msgs, ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return msgs, nil // the batch's time is up
			}
			return msgs, err
		}
		msgs = append(msgs, MessageFromKafka(&km))
		if first && caughtUp(&km) {
			break
		}
	}
	return msgs, nil
}

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
