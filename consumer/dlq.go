package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
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
// topic, partition and offset. Writes are synchronous, idempotent and
// acknowledged by all in-sync replicas, so a batch is committed only after
// its poison messages are safe; records of one original key go to one
// partition of the dead-letter topic, in order. A DLQ is safe for
// concurrent use.
type DLQ struct {
	cl    *kgo.Client
	topic string
}

// NewDLQ returns a DLQ writing to topic through the brokers of conn. It
// does not connect until the first Send.
func NewDLQ(conn KafkaConn, topic string, log *slog.Logger) (*DLQ, error) {
	if len(conn.Brokers) == 0 {
		return nil, errors.New("consumer: DLQ: no brokers")
	}
	if topic == "" {
		return nil, errors.New("consumer: DLQ: no topic")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cl, err := conn.NewClient(log,
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(10*time.Second),
		kgo.RecordDeliveryTimeout(30*time.Second),
		// A DLQ topic that does not exist yet is created when the
		// brokers allow it; otherwise writes fail (and are retried)
		// until an operator creates it.
		kgo.AllowAutoTopicCreation(),
	)
	if err != nil {
		return nil, fmt.Errorf("consumer: DLQ: %w", err)
	}
	return &DLQ{cl: cl, topic: topic}, nil
}

// Topic returns the dead-letter topic's name.
func (d *DLQ) Topic() string { return d.topic }

// Send writes the poison messages and returns once the brokers acknowledged
// all of them.
func (d *DLQ) Send(ctx context.Context, poison []Poison) error {
	recs := make([]*kgo.Record, len(poison))
	for i := range poison {
		recs[i] = dlqRecord(&poison[i])
	}
	err := d.cl.ProduceSync(ctx, recs...).FirstErr()
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
		// Retrying the same records cannot succeed and would hold the
		// partition forever: keep the reason and the origin, drop the
		// large values.
		dropped := 0
		for i, r := range recs {
			if n := len(r.Value); n > maxKeptValue {
				recs[i] = &kgo.Record{Key: r.Key, Timestamp: r.Timestamp,
					Headers: append(r.Headers, kgo.RecordHeader{Key: HeaderValueDropped, Value: []byte(strconv.Itoa(n))})}
				dropped++
			} else {
				recs[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
			}
		}
		if dropped > 0 {
			err = d.cl.ProduceSync(ctx, recs...).FirstErr()
		}
	}
	if err != nil {
		return fmt.Errorf("consumer: write %d poison messages to %s: %w", len(recs), d.topic, err)
	}
	return nil
}

// Close flushes and closes the client.
func (d *DLQ) Close() error {
	d.cl.Close()
	return nil
}

func dlqRecord(p *Poison) *kgo.Record {
	m := &p.Message
	reason := p.Err.Error()
	if len(reason) > maxErrorHeader {
		reason = reason[:maxErrorHeader]
	}
	headers := make([]kgo.RecordHeader, 0, len(m.Headers)+4)
	headers = append(headers, m.Headers...)
	headers = append(headers, kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)})
	if m.Pos.Topic != "" {
		headers = append(headers,
			kgo.RecordHeader{Key: HeaderTopic, Value: []byte(m.Pos.Topic)},
			kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(m.Pos.Partition))},
			kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(m.Pos.Offset, 10))},
		)
	}
	if m.Pos.Line > 0 {
		headers = append(headers, kgo.RecordHeader{Key: HeaderLine, Value: []byte(strconv.Itoa(m.Pos.Line))})
	}
	return &kgo.Record{Key: m.Key, Value: m.Value, Headers: headers, Timestamp: m.Time}
}
