package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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
	// HeaderEndOffset is set on the dead letter of a record batch that
	// decompresses past kafka.max_decompressed_batch_bytes
	// (OversizedBatch): the offset after the batch's last record, with
	// HeaderOffset its first. Such a dead letter has no key and no value.
	HeaderEndOffset = "cachewarden.end-offset"
	// HeaderLine is the input line, for messages read from a file.
	HeaderLine = "cachewarden.line"
	// HeaderTimestamp is the original record's timestamp, in
	// milliseconds since the Unix epoch (decimal). The DLQ record itself
	// is stamped when it is written: the client times a produce out from
	// the record's timestamp, so a poison message read more than the
	// delivery timeout after it was written could never be written with
	// its own.
	HeaderTimestamp = "cachewarden.timestamp"
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
	topic string
	// wait bounds one attempt of Send.
	wait      time.Duration
	newClient func() (*kgo.Client, error)

	mu sync.Mutex
	cl *kgo.Client
}

// NewDLQ returns a DLQ writing to topic through the brokers of conn. It
// does not connect until the first Send.
func NewDLQ(conn KafkaConn, topic string, log *slog.Logger) (*DLQ, error) {
	return newDLQ(conn, topic, log, dlqDeliveryTimeout)
}

// dlqDeliveryTimeout bounds one attempt to write poison messages, from
// when Send hands them to the client; a failed attempt is retried (see
// Pipeline).
const dlqDeliveryTimeout = 30 * time.Second

func newDLQ(conn KafkaConn, topic string, log *slog.Logger, deliveryTimeout time.Duration) (*DLQ, error) {
	if len(conn.Brokers) == 0 {
		return nil, errors.New("kafka: DLQ: no brokers")
	}
	if topic == "" {
		return nil, errors.New("kafka: DLQ: no topic")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	newClient := func() (*kgo.Client, error) {
		return conn.NewClient(log,
			kgo.DefaultProduceTopic(topic),
			kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerLinger(0),
			kgo.ProduceRequestTimeout(dlqRequestTimeout),
			kgo.RecordDeliveryTimeout(deliveryTimeout),
			// A DLQ topic that does not exist yet is created when the
			// brokers allow it; otherwise writes fail (and are retried)
			// until an operator creates it.
			kgo.AllowAutoTopicCreation(),
		)
	}
	cl, err := newClient()
	if err != nil {
		return nil, fmt.Errorf("kafka: DLQ: %w", err)
	}
	return &DLQ{cl: cl, topic: topic, newClient: newClient, wait: deliveryTimeout + dlqRequestTimeout}, nil
}

// dlqRequestTimeout bounds one produce request of the DLQ.
const dlqRequestTimeout = 10 * time.Second

// client returns the client Send writes with.
func (d *DLQ) client() *kgo.Client {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cl
}

// replace closes cl, a client whose writes do not end, and puts a new one
// in its place (unless another Send replaced it already). The client
// cannot give up on records it may have sent (idempotent writes keep
// their sequence), so a request in flight to brokers that vanished would
// hold Send forever; closing it fails every record it holds, and the
// next attempt writes them again: a DLQ record may then be written
// twice.
func (d *DLQ) replace(cl *kgo.Client) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cl != cl {
		return nil
	}
	next, err := d.newClient()
	if err != nil {
		return err
	}
	d.cl = next
	go cl.Close() // Close flushes nothing and ends the stuck ProduceSync
	return nil
}

// produce writes recs and waits for their acknowledgement, at most d.wait
// or until ctx ends.
func (d *DLQ) produce(ctx context.Context, recs []*kgo.Record) error {
	cl := d.client()
	done := make(chan error, 1)
	go func() { done <- cl.ProduceSync(ctx, recs...).FirstErr() }()
	timer := time.NewTimer(d.wait)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// The write ends by itself (or when the DLQ is closed); other
		// partitions' writes share the client, so it stays.
		return ctx.Err()
	case <-timer.C:
	}
	if err := d.replace(cl); err != nil {
		return fmt.Errorf("not acknowledged in %v; new client: %w", d.wait, err)
	}
	<-done
	return fmt.Errorf("%w: not acknowledged in %v", kgo.ErrRecordTimeout, d.wait)
}

// Topic returns the dead-letter topic's name.
func (d *DLQ) Topic() string { return d.topic }

// Send writes the poison messages and returns once the brokers acknowledged
// all of them.
func (d *DLQ) Send(ctx context.Context, poison []pipeline.Poison) error {
	recs := make([]*kgo.Record, len(poison))
	for i := range poison {
		recs[i] = dlqRecord(&poison[i])
	}
	err := d.produce(ctx, recs)
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
		// Retrying the same records cannot succeed and would hold the
		// partition forever: keep the reason and the origin, drop the
		// large values.
		dropped := 0
		for i, r := range recs {
			if n := len(r.Value); n > maxKeptValue {
				recs[i] = &kgo.Record{Key: r.Key,
					Headers: append(r.Headers, kgo.RecordHeader{Key: HeaderValueDropped, Value: []byte(strconv.Itoa(n))})}
				dropped++
			} else {
				recs[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers}
			}
		}
		if dropped > 0 {
			err = d.produce(ctx, recs)
		}
	}
	if err != nil {
		if errors.Is(err, kgo.ErrRecordTimeout) && ctx.Err() == nil {
			// The client's timeout names no cause when the records
			// never left it (brokers unreachable): ask for the topic's
			// metadata to name one.
			if cause := d.probe(ctx); cause != nil {
				err = fmt.Errorf("%w (%w)", err, cause)
			}
		}
		return fmt.Errorf("kafka: write %d poison messages to %s: %w", len(recs), d.topic, err)
	}
	return nil
}

// probeTimeout bounds the metadata request that looks for the cause of a
// failed write.
const probeTimeout = 5 * time.Second

// probe asks the brokers for the DLQ topic's metadata and returns why the
// topic cannot be written (the request failed, or the topic is missing or
// not authorized); nil when nothing is found wrong.
func (d *DLQ) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(d.topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, d.client())
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", d.topic, err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
			return fmt.Errorf("metadata of %s: %w", d.topic, err)
		}
	}
	return nil
}

// Close flushes and closes the client.
func (d *DLQ) Close() error {
	d.client().Close()
	return nil
}

func dlqRecord(p *pipeline.Poison) *kgo.Record {
	m := &p.Message
	reason := p.Err.Error()
	if len(reason) > maxErrorHeader {
		reason = reason[:maxErrorHeader]
	}
	headers := recordHeaders(m.Headers, 4)
	headers = append(headers, kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)})
	if m.Pos.Topic != "" {
		offset := m.Pos.Offset
		var ob *OversizedBatch
		if errors.As(p.Err, &ob) {
			offset = ob.FirstOffset
			headers = append(headers, kgo.RecordHeader{Key: HeaderEndOffset, Value: []byte(strconv.FormatInt(ob.EndOffset, 10))})
		}
		headers = append(headers,
			kgo.RecordHeader{Key: HeaderTopic, Value: []byte(m.Pos.Topic)},
			kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(m.Pos.Partition))},
			kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(offset, 10))},
		)
	}
	if m.Pos.Line > 0 {
		headers = append(headers, kgo.RecordHeader{Key: HeaderLine, Value: []byte(strconv.Itoa(m.Pos.Line))})
	}
	if !m.Time.IsZero() {
		headers = append(headers, kgo.RecordHeader{Key: HeaderTimestamp, Value: []byte(strconv.FormatInt(m.Time.UnixMilli(), 10))})
	}
	// No Timestamp: the client stamps the record when it is produced.
	return &kgo.Record{Key: m.Key, Value: m.Value, Headers: headers}
}
