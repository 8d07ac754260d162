package integration

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Publisher writes change events to Kafka in commit order: each call
// returns once the broker has acknowledged every message of it, and the
// messages of one call keep their order within a partition. Messages are
// partitioned by key hash (FNV-1a, as Sarama and kafka-go hash keys), so
// the messages of one row keep their order. It publishes with franz-go,
// the daemon's own Kafka client.
//
// A Publisher is safe for concurrent use, but calls made concurrently
// have no order between them.
type Publisher struct {
	cl     *kgo.Client
	format Format
	topic  TopicFunc
	log    *slog.Logger
	// registry encodes DebeziumAvro; nil for the other formats.
	registry *AvroRegistry
}

// NewPublisher returns a Publisher for format f; a nil topic uses
// DefaultTopic. Messages are acknowledged by every in-sync replica and
// written by an idempotent producer, so retries neither reorder nor
// repeat them.
func NewPublisher(brokers []string, f Format, topic TopicFunc, log *slog.Logger) (*Publisher, error) {
	if topic == nil {
		topic = DefaultTopic
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(time.Millisecond),
		kgo.RecordRetries(5),
		kgo.AllowAutoTopicCreation(),
	)
	if err != nil {
		return nil, fmt.Errorf("integration: publisher for %v: %w", brokers, err)
	}
	return &Publisher{cl: cl, format: f, topic: topic, log: log}, nil
}

func fnv32a(key []byte) uint32 {
	h := fnv.New32a()
	h.Write(key)
	return h.Sum32()
}

// WithRegistry makes the publisher encode DebeziumAvro with reg's
// schemas, and returns it.
func (p *Publisher) WithRegistry(reg *AvroRegistry) *Publisher {
	p.registry = reg
	return p
}

// Format returns the publisher's format.
func (p *Publisher) Format() Format { return p.format }

// Topic returns the topic t's changes are published to.
func (p *Publisher) Topic(t *Table) string { return p.topic(t) }

// Publish encodes the changes of one or more transactions, in order, and
// writes them. It returns how many messages it wrote.
func (p *Publisher) Publish(ctx context.Context, txs ...Tx) (int, error) {
	var msgs []OutMessage
	for _, tx := range txs {
		m, err := Encode(p.format, tx.Changes, p.topic, p.registry)
		if err != nil {
			return 0, err
		}
		msgs = append(msgs, m...)
	}
	return len(msgs), p.PublishRaw(ctx, msgs...)
}

// PublishRaw writes messages as given, in order.
func (p *Publisher) PublishRaw(ctx context.Context, msgs ...OutMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Timestamp: m.Time}
		for k, v := range m.Headers {
			recs[i].Headers = append(recs[i].Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	if err := p.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("integration: publish %d messages: %w", len(recs), err)
	}
	return nil
}

// Close flushes what is buffered and closes the client.
func (p *Publisher) Close() error {
	err := p.cl.Flush(context.Background())
	p.cl.Close()
	return err
}
