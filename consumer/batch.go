package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/rules"
)

// consumePartition reads one assigned partition in order until ctx ends
// (shutdown or the end of the generation) or reading or committing fails,
// which ends the generation so that the group starts over.
func (d *Daemon) consumePartition(ctx context.Context, gen *kafka.Generation, topic string, pa kafka.PartitionAssignment) {
	log := d.log.With("topic", topic, "partition", pa.ID)
	defer d.m.forgetPartition(topic, pa.ID)
	f, stopFetching := startPartitionFetcher(ctx, d.cfg.Kafka, topic, pa.ID, pa.Offset, log)
	defer stopFetching()
	log.Debug("partition assigned", "offset", pa.Offset)

	var (
		b   Batch
		src = batchSource{f: f}
		// msgs is reused; it is cleared after each batch so that it
		// does not pin message values.
		msgs = make([]Message, 0, d.cfg.MaxEvents)
		// taken is when the previous batch was closed: messages fetched
		// since then have waited for this one.
		taken = time.Now()
		c     = newOffsetCommitter(func(next int64) error { return d.commit(ctx, gen, topic, pa.ID, next) })
	)
	commitCtx, stopCommitting := context.WithCancel(ctx)
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		c.run(commitCtx)
	}()
	defer func() {
		stopCommitting()
		<-committerDone
	}()
	for first := true; ; first = false {
		// Messages applied beyond the committed offset stay at most
		// MaxEvents: the first batch of the partition's next owner
		// covers that many (Config.MaxWait) and turns their counter
		// deltas into recounts. Commits run beside the batches, one at a
		// time, each for the latest applied offset, so that a slow
		// group coordinator holds a partition back only once a full
		// batch's worth is waiting for it.
		room, err := c.room(ctx, d.cfg.MaxEvents)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("committing offset failed; rejoining the group", "error", err.Error())
				d.m.partitionErrors.Inc()
			}
			return
		}
		msgs, taken, err = d.fill(ctx, &src, msgs[:0], room, first, taken)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("reading partition failed; rejoining the group", "error", err.Error())
				d.m.partitionErrors.Inc()
			}
			return
		}
		if first {
			c.begin(msgs[0].Pos.Offset)
		}
		// The first batch after an assignment may repeat messages whose
		// counter deltas the previous owner applied without committing.
		if err := d.p.Process(ctx, &b, msgs, CoalesceOptions{Recount: first}); err != nil {
			log.Debug("batch abandoned uncommitted", "messages", len(msgs), "from_offset", msgs[0].Pos.Offset, "reason", err.Error())
			return
		}
		next := msgs[len(msgs)-1].Pos.Offset + 1
		c.applied(next)
		// Messages between the batch's last one and the high watermark of
		// the last fetch response.
		d.m.setLag(topic, pa.ID, max(src.highWater-next, 0))
		clear(msgs) // do not pin message values until the next batch fills
	}
}

// offsetCommitter commits a partition's applied offsets in the
// background: one commit at a time, each for the latest offset applied
// when it starts. Its methods are safe for concurrent use; run runs in a
// goroutine of its own.
type offsetCommitter struct {
	commit func(next int64) error
	// wake is signalled when want grows; acked when committed grows or
	// err is set.
	wake, acked chan struct{}

	mu        sync.Mutex
	want      int64 // offset after the last applied message
	committed int64 // offset after the last committed message
	err       error // the commit failure that stopped run
}

func newOffsetCommitter(commit func(next int64) error) *offsetCommitter {
	return &offsetCommitter{commit: commit, wake: make(chan struct{}, 1), acked: make(chan struct{}, 1)}
}

// begin sets the offset the partition starts from (the first message
// read), which counts as committed.
func (c *offsetCommitter) begin(offset int64) {
	c.mu.Lock()
	c.want, c.committed = offset, offset
	c.mu.Unlock()
}

// applied records that the messages before next are applied.
func (c *offsetCommitter) applied(next int64) {
	c.mu.Lock()
	c.want = next
	c.mu.Unlock()
	signal(c.wake)
}

// room waits until fewer than limit offsets are applied and uncommitted
// and returns how many more messages may be applied (offsets missing from
// the log count too, so it errs on the safe side). It returns the error
// of a failed commit, or ctx's.
func (c *offsetCommitter) room(ctx context.Context, limit int) (int, error) {
	for {
		c.mu.Lock()
		n, err := limit-int(c.want-c.committed), c.err
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if n > 0 {
			return n, nil
		}
		select {
		case <-c.acked:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// run commits until ctx ends or a commit fails.
func (c *offsetCommitter) run(ctx context.Context) {
	for {
		select {
		case <-c.wake:
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		want, done := c.want, c.committed
		c.mu.Unlock()
		if want <= done {
			continue
		}
		err := c.commit(want)
		c.mu.Lock()
		if err != nil {
			c.err = fmt.Errorf("offset %d: %w", want, err)
		} else {
			c.committed = want
		}
		c.mu.Unlock()
		signal(c.acked)
		if err != nil {
			return
		}
		signal(c.wake) // more may have been applied meanwhile
	}
}

// signal wakes the receiver of ch (capacity 1) without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// batchSource is the batcher's side of a partitionFetcher: the chunk it
// is taking messages from.
type batchSource struct {
	f       *partitionFetcher
	pending []Message // the rest of chunk
	chunk   []Message // the slice pending is part of, recycled when empty
	// highWater is the high watermark of the chunk's fetch response.
	highWater int64
}

// receive waits for the next chunk until ctx ends or, with a non-nil
// timer, the timer fires (ok false, err nil).
func (s *batchSource) receive(ctx context.Context, timer <-chan time.Time) (ok bool, err error) {
	select {
	case c, open := <-s.f.chunks:
		if !open {
			// The fetcher stops without an error only when ctx ends.
			if err := ctx.Err(); err != nil {
				return false, err
			}
			return false, errors.New("partition fetcher stopped")
		}
		if c.err != nil {
			return false, c.err
		}
		if s.chunk != nil {
			s.f.recycle(s.chunk)
		}
		s.chunk, s.pending, s.highWater = c.msgs, c.msgs, c.highWater
		return true, nil
	case <-timer:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// take appends up to max pending messages to msgs; with stopAtEnd it
// stops after a message that was the partition's last when fetched, and
// reports that it did.
func (s *batchSource) take(msgs []Message, max int, stopAtEnd bool) ([]Message, bool) {
	n := min(len(s.pending), max)
	if stopAtEnd && s.highWater > 0 {
		for i := range n {
			if s.pending[i].Pos.Offset+1 >= s.highWater {
				msgs = append(msgs, s.pending[:i+1]...)
				s.pending = s.pending[i+1:]
				return msgs, true
			}
		}
	}
	msgs = append(msgs, s.pending[:n]...)
	s.pending = s.pending[n:]
	return msgs, false
}

// takeBefore appends up to max pending messages with offsets before end
// to msgs; atEnd reports that every message before end has been taken (a
// message at or past end was reached, or the one at end-1 taken).
func (s *batchSource) takeBefore(msgs []Message, max int, end int64) (_ []Message, atEnd bool) {
	n := min(len(s.pending), max)
	for i := range n {
		if s.pending[i].Pos.Offset >= end {
			msgs = append(msgs, s.pending[:i]...)
			s.pending = s.pending[i:]
			return msgs, true
		}
	}
	msgs = append(msgs, s.pending[:n]...)
	s.pending = s.pending[n:]
	return msgs, n > 0 && msgs[len(msgs)-1].Pos.Offset+1 >= end
}

// fill appends the next batch of messages to msgs: it waits for one
// message, then takes more until limit or until MaxWait has passed
// since the first one became available, and returns the batch and when
// it was closed. A first message that was already waiting when fill was
// called counts as available since prevTaken, when the previous batch was
// closed: while that batch was applied and committed, the messages behind
// it have been waiting already, and holding the next batch open for a
// full MaxWait more would add the time of every apply to their latency.
// The first batch after an assignment waits for more instead (see
// Config.MaxWait): until the partition's end as the fetch responses
// report it, MaxEvents, or max(MaxWait, 2s).
func (d *Daemon) fill(ctx context.Context, src *batchSource, msgs []Message, limit int, first bool, prevTaken time.Time) ([]Message, time.Time, error) {
	called := time.Now()
	if len(src.pending) == 0 {
		if _, err := src.receive(ctx, nil); err != nil {
			return msgs, time.Now(), err
		}
	}
	msgs, end := src.take(msgs, limit-len(msgs), first)
	if end || len(msgs) == limit {
		return msgs, time.Now(), nil
	}
	opened := time.Now()
	if opened.Sub(called) < waitingThreshold {
		opened = prevTaken // the messages were fetched already
	}
	wait := d.cfg.MaxWait
	if first {
		wait = max(wait, firstBatchWait)
	}
	// At least a quarter of MaxWait remains to take the waiting messages:
	// a batch behind a slow one must not shrink to a few messages, or
	// the partition would fall further behind.
	closeAt := later(opened.Add(wait), time.Now().Add(wait/4))
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for len(msgs) < limit {
		if len(src.pending) == 0 {
			if timer == nil {
				timer = time.NewTimer(time.Until(closeAt))
			}
			ok, err := src.receive(ctx, timer.C)
			if err != nil {
				return msgs, time.Now(), err
			}
			if !ok {
				break // the batch's time is up
			}
		}
		if msgs, end = src.take(msgs, limit-len(msgs), first); end {
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

// waitingThreshold tells messages that were fetched already (taking them
// takes microseconds) from messages fill had to wait for. A slow return misjudged as waiting only keeps the batch open for
// the full MaxWait.
const waitingThreshold = time.Millisecond

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
