package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// OversizedBatch is the error of a Message that stands for a fetched
// record batch whose records decompress to more than
// kafka.max_decompressed_batch_bytes (a compression bomb, or a producer
// batching far more than the topic's messages need). The batch's records
// are never read: the message is poison, its dead letter names the batch
// (not its contents), the fallback namespaces and generations of its
// topic's tables are bumped, and the partition moves past it.
type OversizedBatch struct {
	Topic     string
	Partition int32
	// FirstOffset is the batch's first offset; EndOffset the offset
	// after its last record.
	FirstOffset, EndOffset int64
	// Limit is kafka.max_decompressed_batch_bytes.
	Limit int
	// CompressedBytes is the batch's compressed size as fetched; 0 when
	// unknown.
	CompressedBytes int
	// Stuck means the Kafka client could not be moved past the batch:
	// a group client moves only partitions it has read records of or
	// found a commit for, so a partition whose first batch ever is this
	// one stops once the batch is committed past, until it is assigned
	// again (StuckError).
	Stuck bool
}

// StuckError is the fetch error of a partition stopped after e (Stuck).
func (e *OversizedBatch) StuckError() error {
	return fmt.Errorf("%w; the Kafka client cannot skip a batch in a partition it has read nothing of before: committed past it, the partition continues when next assigned (restart or rebalance)", e)
}

func (e *OversizedBatch) Error() string {
	size := ""
	if e.CompressedBytes > 0 {
		size = fmt.Sprintf(" (%d bytes compressed)", e.CompressedBytes)
	}
	return fmt.Sprintf("record batch at offsets %d to %d of %s/%d%s decompresses to more than %d bytes (kafka.max_decompressed_batch_bytes); its records were not read",
		e.FirstOffset, e.EndOffset-1, e.Topic, e.Partition, size, e.Limit)
}

// oversizedMessage returns the message that stands for the batch e
// names: at the batch's last offset, so that committing past it commits
// past the batch.
func oversizedMessage(e *kgo.ErrDecompressTooLarge, limit, compressed int, fetched time.Time) pipeline.Message {
	ob := &OversizedBatch{Topic: e.Topic, Partition: e.Partition, FirstOffset: e.Offset, EndOffset: e.NextOffset,
		Limit: limit, CompressedBytes: compressed}
	return pipeline.Message{Fetched: fetched, Failed: ob,
		Pos: rules.Position{Topic: e.Topic, Partition: int(e.Partition), Offset: e.NextOffset - 1}}
}

// failedBatchSizes remembers, per partition, the compressed size of the
// last fetched batch that yielded no records (kgo.HookFetchBatchRead), so
// that an oversized batch's dead letter can say how small it was. Safe
// for concurrent use; it holds one entry per partition at most.
type failedBatchSizes struct {
	mu sync.Mutex
	m  map[topicPartition]int
}

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (s *failedBatchSizes) OnFetchBatchRead(_ kgo.BrokerMetadata, topic string, partition int32, m kgo.FetchBatchMetrics) {
	if m.NumRecords != 0 || m.CompressionType == 0 {
		return
	}
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[topicPartition]int)
	}
	s.m[topicPartition{topic, int(partition)}] = m.CompressedBytes
	s.mu.Unlock()
}

// take returns and forgets the size remembered for a partition; 0 when
// none.
func (s *failedBatchSizes) take(topic string, partition int32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	tp := topicPartition{topic, int(partition)}
	n := s.m[tp]
	delete(s.m, tp)
	return n
}

// skipOversized hands the partition's queue a message standing for the
// oversized batch e names, and moves the client's cursor past the batch:
// the client stops fetching a partition at such a batch until its offset
// is set. With no queue (the partition was revoked meanwhile) nothing is
// done: its next owner meets the batch again.
func skipOversized(cl *kgo.Client, q *partitionQueue, e *kgo.ErrDecompressTooLarge, log *slog.Logger) {
	if q == nil {
		log.Warn("kafka: oversized batch of a partition no longer consumed here", "topic", e.Topic, "partition", e.Partition, "offset", e.Offset)
		return
	}
	limit, _ := cl.OptValue(kgo.MaxDecompressBatchBytes).(int)
	compressed := 0
	if s := clientHook[*failedBatchSizes](cl); s != nil {
		compressed = s.take(e.Topic, e.Partition)
	}
	m := oversizedMessage(e, limit, compressed, time.Now())
	if group, _ := cl.OptValue(kgo.ConsumerGroup).(string); group != "" {
		if _, tracked := cl.CommittedOffsets()[e.Topic][e.Partition]; !tracked {
			// A group client moves only partitions it has read
			// records of or found a commit for.
			m.Failed.(*OversizedBatch).Stuck = true
		}
	}
	q.pushMessage(m)
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{e.Topic: {e.Partition: {Epoch: e.Epoch, Offset: e.NextOffset}}})
	// Decompressing the batch up to the bound left buffers of up to
	// three times it in the client's pools (and the fetch response that
	// carried it): give them back now, so that bombs one after another
	// do not add up. Two collections empty a sync.Pool.
	debug.FreeOSMemory()
	debug.FreeOSMemory()
}

// asOversized returns err as a *kgo.ErrDecompressTooLarge.
func asOversized(err error) (*kgo.ErrDecompressTooLarge, bool) {
	var e *kgo.ErrDecompressTooLarge
	return e, errors.As(err, &e)
}
