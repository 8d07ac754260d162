package kafka

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// pollLoop polls cl until ctx ends or the client is closed, handing each
// partition's records to the queue that route returns for it. A nil
// queue means the partition is no longer consumed here (revoked while
// the poll was under way): its records are dropped, and its next owner
// reads them from the committed offset. Every record is recycled once
// handed over or dropped (see recordPool): cl must not be polled
// elsewhere.
//
// A partition's fetch error goes to its queue: the client returns only
// errors it does not retry by itself (an offset out of range with no
// reset configured, authorization, a corrupt or unsupported batch), and
// it stops fetching that partition after one. A batch that decompresses
// past the client's MaxDecompressBatchBytes is not an error: its
// partition's queue gets a message standing for it (OversizedBatch), and
// fetching goes on past it. Data-loss notices (the
// client found the log truncated under it and resumed at the divergence)
// are logged.
func pollLoop(ctx context.Context, cl *kgo.Client, route func(topic string, partition int32) *partitionQueue, log *slog.Logger) {
	var oversized []*kgo.ErrDecompressTooLarge
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			return
		}
		oversized = oversized[:0]
		fetches.EachError(func(topic string, partition int32, err error) {
			var loss *kgo.ErrDataLoss
			switch {
			case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
				// The poll ended with ctx.
			case errors.As(err, new(*kgo.ErrDecompressTooLarge)):
				// Poison, after the partition's records of this poll.
				e, _ := asOversized(err)
				oversized = append(oversized, e)
			case errors.As(err, &loss):
				log.Warn("kafka: partition log was truncated under the consumer; continuing where it diverged",
					"topic", topic, "partition", partition, "error", err.Error())
			default:
				if q := route(topic, partition); q != nil {
					q.fail(err)
				} else {
					log.Warn("kafka: fetch error", "topic", topic, "partition", partition, "error", err.Error())
				}
			}
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			if q := route(p.Topic, p.Partition); q != nil {
				q.push(p.Records, p.LastStableOffset, p.LogStartOffset)
			}
			for _, r := range p.Records {
				r.Recycle()
			}
		})
		for _, e := range oversized {
			skipOversized(cl, route(e.Topic, e.Partition), e, log)
		}
	}
}

// recordPool lends a Kafka client the slices it decodes fetched records
// into (kgo.PoolRecords), so that fetching allocates no record structs:
// pollLoop converts each record to a Message, which shares the record's
// key, value and headers, and recycles it at once. Those stay valid:
// they are parts of the fetch response, or of a decompressed batch, and
// neither is pooled (a kgo.PoolDecompressBytes would zero the decompressed
// bytes on recycling, under the Messages' values). Safe for concurrent use.
type recordPool struct{ slices *sync.Pool }

func newRecordPool() recordPool { return recordPool{slices: &sync.Pool{}} }

// GetRecords returns a slice with capacity n at least.
func (p recordPool) GetRecords(n int) []kgo.Record {
	if s, ok := p.slices.Get().(*[]kgo.Record); ok && cap(*s) >= n {
		return (*s)[:0]
	}
	return make([]kgo.Record, 0, n)
}

// PutRecords takes back a slice the client no longer uses.
func (p recordPool) PutRecords(rs []kgo.Record) { p.slices.Put(&rs) }
