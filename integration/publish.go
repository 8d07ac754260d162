package integration

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// Publisher writes change events to Kafka in commit order: each call
// returns once the broker has acknowledged every message of it, and the
// messages of one call keep their order within a partition. Messages are
// partitioned by key hash, like the connectors' default partitioner.
//
// A Publisher is safe for concurrent use, but calls made concurrently
// have no order between them.
type Publisher struct {
	w      *kafka.Writer
	format Format
	topic  TopicFunc
	log    *slog.Logger
	// registry encodes DebeziumAvro; nil for the other formats.
	registry *AvroRegistry
}

// NewPublisher returns a Publisher for format f; a nil topic uses
// DefaultTopic.
func NewPublisher(brokers []string, f Format, topic TopicFunc, log *slog.Logger) *Publisher {
	if topic == nil {
		topic = DefaultTopic
	}
	return &Publisher{
		w: &kafka.Writer{
			Addr:                   kafka.TCP(brokers...),
			Balancer:               &kafka.Hash{},
			RequiredAcks:           kafka.RequireAll,
			BatchTimeout:           time.Millisecond,
			BatchSize:              1000,
			MaxAttempts:            5,
			AllowAutoTopicCreation: true,
		},
		format: f,
		topic:  topic,
		log:    log,
	}
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
	km := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		km[i] = kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value}
		for k, v := range m.Headers {
			km[i].Headers = append(km[i].Headers, kafka.Header{Key: k, Value: []byte(v)})
		}
	}
	if err := p.w.WriteMessages(ctx, km...); err != nil {
		return fmt.Errorf("integration: publish %d messages: %w", len(km), err)
	}
	return nil
}

// Close flushes and closes the writer.
func (p *Publisher) Close() error { return p.w.Close() }
