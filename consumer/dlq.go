package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// Headers a DLQ record carries besides the original record's own headers.
const (
	// HeaderError is the reason the message is poison.
	HeaderError = "cachewarden.error"
	// HeaderTopic, HeaderPartition and HeaderOffset locate the original
	// record (partition and offset in decimal).
	HeaderTopic     = "cachewarden.topic"
	HeaderPartition = "cachewarden.partition"
	HeaderOffset    = "cachewarden.offset"
	// HeaderLine is the input line, for messages read from a file.
	HeaderLine = "cachewarden.line"
	// HeaderValueDropped is set, to the value's size in bytes, on a DLQ
	// record written without its value because the brokers refused it as
	// too large; the original stays at the topic, partition and offset
	// the other headers name.
	HeaderValueDropped = "cachewarden.value-dropped"
)

// maxKeptValue is the largest value a DLQ record keeps once the brokers
// refused a batch as too large (Kafka's default max.message.bytes is
// 1 MiB).
const maxKeptValue = 256 << 10

// maxErrorHeader bounds the error header's length in bytes.
const maxErrorHeader = 1024

// DLQ writes poison messages to a dead-letter topic: the original key,
// value and headers, plus headers naming the error and the original
// topic, partition and offset. Writes are synchronous and acknowledged by
// all in-sync replicas, so a batch is committed only after its poison
// messages are safe. A DLQ is safe for concurrent use.
type DLQ struct {
	w     *kafka.Writer
	topic string
}

// NewDLQ returns a DLQ writing to topic through the brokers of conn.
func NewDLQ(conn KafkaConn, topic string) (*DLQ, error) {
	if len(conn.Brokers) == 0 {
		return nil, errors.New("consumer: DLQ: no brokers")
	}
	if topic == "" {
		return nil, errors.New("consumer: DLQ: no topic")
	}
	w := &kafka.Writer{
		Addr:         kafka.TCP(conn.Brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{}, // records of one original key stay in order
		RequiredAcks: kafka.RequireAll,
		MaxAttempts:  3,
		BatchTimeout: 5 * time.Millisecond,
		WriteTimeout: 10 * time.Second,
		// A DLQ topic that does not exist yet is created when the brokers
		// allow it; otherwise writes fail (and are retried) until an
		// operator creates it.
		AllowAutoTopicCreation: true,
		Transport:              conn.Transport(),
	}
	return &DLQ{w: w, topic: topic}, nil
}

// Topic returns the dead-letter topic's name.
func (d *DLQ) Topic() string { return d.topic }

// Send writes the poison messages and returns once the brokers acknowledged
// all of them.
func (d *DLQ) Send(ctx context.Context, poison []Poison) error {
	msgs := make([]kafka.Message, len(poison))
	for i := range poison {
		msgs[i] = dlqRecord(&poison[i])
	}
	err := d.w.WriteMessages(ctx, msgs...)
	if errors.Is(err, kafka.MessageSizeTooLarge) {
		// Retrying the same records cannot succeed and would hold the
		// partition forever: keep the reason and the origin, drop the
		// large values.
		dropped := 0
		for i := range msgs {
			if n := len(msgs[i].Value); n > maxKeptValue {
				msgs[i].Value = nil
				msgs[i].Headers = append(msgs[i].Headers, kafka.Header{Key: HeaderValueDropped, Value: []byte(strconv.Itoa(n))})
				dropped++
			}
		}
		if dropped > 0 {
			err = d.w.WriteMessages(ctx, msgs...)
		}
	}
	if err != nil {
		return fmt.Errorf("consumer: write %d poison messages to %s: %w", len(msgs), d.topic, err)
	}
	return nil
}

// Close flushes and closes the writer.
func (d *DLQ) Close() error { return d.w.Close() }

func dlqRecord(p *Poison) kafka.Message {
	m := &p.Message
	reason := p.Err.Error()
	if len(reason) > maxErrorHeader {
		reason = reason[:maxErrorHeader]
	}
	headers := make([]kafka.Header, 0, len(m.Headers)+4)
	headers = append(headers, m.Headers...)
	headers = append(headers, kafka.Header{Key: HeaderError, Value: []byte(reason)})
	if m.Pos.Topic != "" {
		headers = append(headers,
			kafka.Header{Key: HeaderTopic, Value: []byte(m.Pos.Topic)},
			kafka.Header{Key: HeaderPartition, Value: []byte(strconv.Itoa(m.Pos.Partition))},
			kafka.Header{Key: HeaderOffset, Value: []byte(strconv.FormatInt(m.Pos.Offset, 10))},
		)
	}
	if m.Pos.Line > 0 {
		headers = append(headers, kafka.Header{Key: HeaderLine, Value: []byte(strconv.Itoa(m.Pos.Line))})
	}
	return kafka.Message{Key: m.Key, Value: m.Value, Headers: headers, Time: m.Time}
}
