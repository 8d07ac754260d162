package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// Partition fetch settings.
const (
	// fetchMaxWait is how long one fetch waits on the broker for new
	// messages when the partition has none.
	fetchMaxWait = time.Second
	// fetchMaxBytes bounds one fetch response.
	fetchMaxBytes = 16 << 20
	// fetchReadTimeout bounds reading one fetch response beyond
	// fetchMaxWait: a broker that stops answering is detected after it.
	fetchReadTimeout = 10 * time.Second
	// fetchChunk is the most messages handed to the batcher at once.
	fetchChunk = 500
	// fetchAhead is how many chunks may wait for the batcher: with
	// fetchChunk, at most 1,000 fetched messages wait per partition.
	fetchAhead = 2
	// fetchAttempts is how many consecutive connection failures are
	// retried before the fetcher reports an error, which makes the
	// partition rejoin the group.
	fetchAttempts = 3
	// fetchBackoffMin and fetchBackoffMax bound the pause between
	// attempts.
	fetchBackoffMin = 100 * time.Millisecond
	fetchBackoffMax = 5 * time.Second
)

// fetchedChunk is a run of consecutive messages of one fetch response, or
// the error that stopped the fetcher.
type fetchedChunk struct {
	msgs []Message
	// highWater is the partition's high watermark in the response: the
	// offset after the last message then in the partition.
	highWater int64
	err       error
}

// partitionFetcher reads one partition ahead of the batcher over a
// connection to the partition's leader, one fetch request at a time, and
// hands the messages over in chunks. Compared with kafka-go's Reader it
// sets no read deadline and sends nothing through a channel per message.
//
// run works in a goroutine of its own; the batcher receives from chunks
// and gives slices back with recycle. Nothing else is shared.
type partitionFetcher struct {
	dialer    *kafka.Dialer
	brokers   []string
	topic     string
	partition int
	log       *slog.Logger
	// chunks carries fetched messages to the batcher; closed when run
	// returns.
	chunks chan fetchedChunk
	// spare returns chunk slices the batcher has copied out.
	spare chan []Message
}

func newPartitionFetcher(dialer *kafka.Dialer, brokers []string, topic string, partition int, log *slog.Logger) *partitionFetcher {
	return &partitionFetcher{
		dialer: dialer, brokers: brokers, topic: topic, partition: partition, log: log,
		chunks: make(chan fetchedChunk, fetchAhead),
		spare:  make(chan []Message, fetchAhead+1),
	}
}

// startPartitionFetcher runs a partitionFetcher of partition from offset
// in a goroutine of its own until ctx ends or stop is called; stop waits
// for it to end.
func startPartitionFetcher(ctx context.Context, conn KafkaConn, topic string, partition int, offset int64, log *slog.Logger) (f *partitionFetcher, stop func()) {
	f = newPartitionFetcher(conn.Dialer(), conn.Brokers, topic, partition, log)
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(fctx, offset)
	}()
	return f, func() {
		cancel()
		<-done
	}
}

// run fetches from offset (kafka.FirstOffset, kafka.LastOffset or an
// absolute offset) until ctx ends or fetching fails for good, and then
// closes f.chunks. An offset before the partition's first (deleted by
// retention) continues at the first, as kafka-go's Reader does.
func (f *partitionFetcher) run(ctx context.Context, offset int64) {
	defer close(f.chunks)
	failures := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 && sleep(ctx, fetchBackoff(attempt)) != nil {
			return
		}
		next, err := f.session(ctx, offset)
		if ctx.Err() != nil {
			return
		}
		if next > offset || (offset < 0 && next >= 0) {
			offset, failures, attempt = next, 0, 0 // progress: start over with the backoff
		}
		if errors.Is(err, errPastEnd) {
			// Logged by seek; wait for messages with the backoff,
			// without giving the partition up.
			continue
		}
		failures++
		if failures >= fetchAttempts || !fetchRetryable(err) {
			f.send(ctx, fetchedChunk{err: fmt.Errorf("fetch %s/%d at offset %d: %w", f.topic, f.partition, offset, err)})
			return
		}
		f.log.Warn("fetching partition failed; reconnecting", "offset", offset, "error", err.Error())
	}
}

// errPastEnd reports an offset beyond the partition's end.
var errPastEnd = errors.New("offset is past the partition's end")

// fetchRetryable reports whether a fetch error is worth a new connection
// rather than leaving the partition to the group's next generation.
func fetchRetryable(err error) bool {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.UnknownTopicOrPartition,
			kafka.RequestTimedOut, kafka.NotEnoughReplicas, kafka.BrokerNotAvailable,
			kafka.KafkaStorageError, kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch,
			kafka.OffsetNotAvailable:
			// The leader moved or is being elected: a new connection
			// asks the metadata for the current one.
			return true
		default:
			// Authorization, unsupported versions, corrupt records:
			// a reconnect changes nothing.
			return false
		}
	}
	// Network errors, timeouts and connections closed by the broker.
	return true
}

// session connects to the partition's leader and fetches from offset
// until an error, returning the offset it got to.
func (f *partitionFetcher) session(ctx context.Context, offset int64) (int64, error) {
	conn, err := f.dial(ctx)
	if err != nil {
		return offset, err
	}
	defer conn.Close()
	// Reads do not watch ctx: closing the connection ends a pending one.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	if offset, err = f.seek(conn, offset); err != nil {
		return offset, err
	}
	for {
		next, err := f.fetch(ctx, conn, offset)
		if errors.Is(err, kafka.OffsetOutOfRange) {
			next, err = f.seek(conn, next)
		}
		offset = next
		if err != nil {
			return offset, err
		}
	}
}

func (f *partitionFetcher) dial(ctx context.Context) (*kafka.Conn, error) {
	var errs []error
	for _, b := range f.brokers {
		conn, err := f.dialer.DialLeader(ctx, "tcp", b, f.topic, f.partition)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// seek resolves offset against the partition's first and last offsets
// and positions conn there.
func (f *partitionFetcher) seek(conn *kafka.Conn, offset int64) (int64, error) {
	conn.SetDeadline(time.Now().Add(fetchReadTimeout))
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return offset, err
	}
	switch {
	case offset == kafka.FirstOffset:
		offset = first
	case offset == kafka.LastOffset:
		offset = last
	case offset < first:
		f.log.Error("partition offset is before the partition's first; skipping deleted messages",
			"offset", offset, "first", first, "skipped", first-offset)
		offset = first
	case offset > last:
		// Past the end (a truncated or recreated topic): wait for
		// messages there, as kafka-go's Reader does.
		f.log.Warn("partition offset is past the partition's end; waiting for messages", "offset", offset, "end", last)
		return offset, errPastEnd
	}
	if _, err := conn.Seek(offset, kafka.SeekAbsolute); err != nil {
		return offset, err
	}
	conn.SetDeadline(time.Time{})
	return offset, nil
}

// fetch sends one fetch request and hands its messages over in chunks,
// returning the offset after the last message handed over.
func (f *partitionFetcher) fetch(ctx context.Context, conn *kafka.Conn, offset int64) (int64, error) {
	conn.SetReadDeadline(time.Now().Add(fetchMaxWait + fetchReadTimeout))
	batch := conn.ReadBatchWith(kafka.ReadBatchConfig{
		MinBytes:       1,
		MaxBytes:       fetchMaxBytes,
		MaxWait:        fetchMaxWait,
		IsolationLevel: kafka.ReadCommitted,
	})
	chunk := fetchedChunk{highWater: batch.HighWaterMark(), msgs: f.spareSlice()}
	var err error
	for {
		var km kafka.Message
		if km, err = batch.ReadMessage(); err != nil {
			break
		}
		chunk.msgs = append(chunk.msgs, MessageFromKafka(&km))
		offset = km.Offset + 1
		if len(chunk.msgs) == fetchChunk {
			// The batcher may hold the chunk back for long (memcached
			// down): the rest of the response waits without a deadline.
			conn.SetReadDeadline(time.Time{})
			if !f.send(ctx, chunk) {
				batch.Close()
				return offset, ctx.Err()
			}
			conn.SetReadDeadline(time.Now().Add(fetchReadTimeout))
			chunk.msgs = f.spareSlice()
		}
	}
	closeErr := batch.Close()
	if len(chunk.msgs) > 0 && !f.send(ctx, chunk) {
		return offset, ctx.Err()
	}
	if errors.Is(err, io.EOF) {
		err = closeErr // the end of the response, or the error it carried
	}
	if errors.Is(err, kafka.RequestTimedOut) {
		err = nil // no new message within fetchMaxWait
	}
	return offset, err
}

// send hands c to the batcher; false when ctx ended first.
func (f *partitionFetcher) send(ctx context.Context, c fetchedChunk) bool {
	select {
	case f.chunks <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *partitionFetcher) spareSlice() []Message {
	select {
	case s := <-f.spare:
		return s[:0]
	default:
		return make([]Message, 0, fetchChunk)
	}
}

// recycle returns a chunk slice whose messages the batcher has copied
// out; it must not be used afterwards.
func (f *partitionFetcher) recycle(s []Message) {
	clear(s) // do not pin message values
	select {
	case f.spare <- s[:0]:
	default:
	}
}

// fetchBackoff is the pause before attempt (1, 2, ...): doubling from
// fetchBackoffMin up to fetchBackoffMax.
func fetchBackoff(attempt int) time.Duration {
	d := fetchBackoffMin << min(attempt-1, 16)
	return min(d, fetchBackoffMax)
}
