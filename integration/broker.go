package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// BrokerOptions says which broker to use and which topics it must have.
type BrokerOptions struct {
	// Addrs are the bootstrap addresses of an existing Kafka-protocol
	// broker. When empty, an in-process broker is started on a random
	// loopback port.
	Addrs []string
	// Topics are created when missing, with Partitions partitions each
	// (default 1). Topics that already exist are left as they are.
	Topics     []string
	Partitions int
}

// Broker is a running Kafka-protocol broker. Its methods are safe for
// concurrent use.
type Broker struct {
	addrs   []string
	cluster *kfake.Cluster // nil when the broker is external
	log     *slog.Logger
	// transport is the admin clients' own: kafka-go's default one caches
	// metadata for seconds, which hides topics created meanwhile.
	transport *kafka.Transport
}

// StartBroker connects to the broker named in opts, or starts an in-process
// one (github.com/twmb/franz-go/pkg/kfake, one node, automatic topic
// creation on). It creates the requested topics and returns once the
// broker answers metadata requests for them.
//
// The tests pass internal/testsvc's Kafka() as opts.Addrs, so their broker
// is the one CACHEWARDEN_TEST_KAFKA names, else a Kafka container when a
// Docker engine answers (and CACHEWARDEN_TEST_CONTAINERS is not "0"), else
// the in-process one. StartBroker itself reads no environment variable and
// starts no container.
func StartBroker(ctx context.Context, log *slog.Logger, opts BrokerOptions) (*Broker, error) {
	partitions := opts.Partitions
	if partitions <= 0 {
		partitions = 1
	}
	b := &Broker{addrs: opts.Addrs, log: log, transport: &kafka.Transport{MetadataTTL: 50 * time.Millisecond}}
	if len(b.addrs) == 0 {
		kopts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1)}
		if len(opts.Topics) > 0 {
			kopts = append(kopts, kfake.SeedTopics(int32(partitions), opts.Topics...))
		}
		cluster, err := kfake.NewCluster(kopts...)
		if err != nil {
			return nil, fmt.Errorf("integration: start in-process broker: %w", err)
		}
		b.cluster = cluster
		b.addrs = cluster.ListenAddrs()
		log.Debug("in-process Kafka-protocol broker started", "addrs", b.addrs)
	} else if len(opts.Topics) > 0 {
		if err := b.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
			return nil, err
		}
	}
	if err := b.waitTopics(ctx, opts.Topics); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Addrs returns the broker's bootstrap addresses.
func (b *Broker) Addrs() []string { return append([]string(nil), b.addrs...) }

// InProcess reports whether the broker runs inside this process.
func (b *Broker) InProcess() bool { return b.cluster != nil }

// Close closes the admin connections and stops an in-process broker.
func (b *Broker) Close() {
	b.transport.CloseIdleConnections()
	if b.cluster != nil {
		b.cluster.Close()
	}
}

func (b *Broker) client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(b.addrs...), Timeout: 10 * time.Second, Transport: b.transport}
}

// CreateTopics creates topics with the given partition count; a topic that
// exists already is not an error.
func (b *Broker) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 1})
	}
	resp, err := b.client().CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("integration: create topics %v: %w", topics, err)
	}
	for topic, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("integration: create topic %q: %w", topic, err)
		}
	}
	return nil
}

// waitTopics polls metadata until every topic reports its partitions with a
// leader.
func (b *Broker) waitTopics(ctx context.Context, topics []string) error {
	if len(topics) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		resp, err := b.client().Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if err == nil {
			ready := 0
			for _, t := range resp.Topics {
				if t.Error == nil && len(t.Partitions) > 0 && allLed(t.Partitions) {
					ready++
				}
			}
			if ready == len(topics) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("integration: broker %v: topics %v not ready: %w (last error: %v)", b.addrs, topics, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// allLed reports whether every partition has a leader. A Kafka broker may
// report a topic it has just created before its partitions have one.
func allLed(partitions []kafka.Partition) bool {
	for _, p := range partitions {
		if p.Error != nil || p.Leader.Host == "" {
			return false
		}
	}
	return true
}

// Partitions returns how many partitions topic has. A topic created a
// moment ago may be unknown to cached metadata; it is asked for again for
// up to a second before it counts as missing.
func (b *Broker) Partitions(ctx context.Context, topic string) (int, error) {
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("integration: metadata for %q: %w (last error: %v)", topic, ctx.Err(), lastErr)
			case <-time.After(50 * time.Millisecond):
			}
		}
		resp, err := b.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil {
			return 0, fmt.Errorf("integration: metadata for %q: %w", topic, err)
		}
		lastErr = fmt.Errorf("topic %q not in metadata", topic)
		for _, t := range resp.Topics {
			if t.Name != topic {
				continue
			}
			switch {
			case errors.Is(t.Error, kafka.UnknownTopicOrPartition):
				lastErr = t.Error
			case t.Error != nil:
				return 0, fmt.Errorf("integration: metadata for %q: %w", topic, t.Error)
			default:
				return len(t.Partitions), nil
			}
		}
	}
	return 0, fmt.Errorf("integration: metadata for %q: %w", topic, lastErr)
}

// EndOffsets returns the next offset to be written of every partition of
// the topics (the high watermarks), by topic and partition.
func (b *Broker) EndOffsets(ctx context.Context, topics ...string) (map[string]map[int]int64, error) {
	c := b.client()
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range topics {
		n, err := b.Partitions(ctx, t)
		if err != nil {
			return nil, err
		}
		for p := 0; p < n; p++ {
			req.Topics[t] = append(req.Topics[t], kafka.LastOffsetOf(p))
		}
	}
	resp, err := c.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("integration: list offsets: %w", err)
	}
	out := make(map[string]map[int]int64, len(topics))
	for t, parts := range resp.Topics {
		out[t] = make(map[int]int64, len(parts))
		for _, p := range parts {
			if p.Error != nil {
				return nil, fmt.Errorf("integration: list offsets %s/%d: %w", t, p.Partition, p.Error)
			}
			out[t][p.Partition] = p.LastOffset
		}
	}
	return out, nil
}

// CommittedOffsets returns the offsets group has committed for the topics'
// partitions (-1 where it has committed nothing).
func (b *Broker) CommittedOffsets(ctx context.Context, group string, topics ...string) (map[string]map[int]int64, error) {
	c := b.client()
	req := &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{}}
	for _, t := range topics {
		n, err := b.Partitions(ctx, t)
		if err != nil {
			return nil, err
		}
		for p := 0; p < n; p++ {
			req.Topics[t] = append(req.Topics[t], p)
		}
	}
	resp, err := c.OffsetFetch(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("integration: fetch offsets of group %q: %w", group, err)
	}
	if errors.Is(resp.Error, kafka.GroupIdNotFound) {
		// The group has not committed anything yet.
		out := make(map[string]map[int]int64, len(topics))
		for t, parts := range req.Topics {
			out[t] = make(map[int]int64, len(parts))
			for _, p := range parts {
				out[t][p] = -1
			}
		}
		return out, nil
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("integration: fetch offsets of group %q: %w", group, resp.Error)
	}
	out := make(map[string]map[int]int64, len(topics))
	for t, parts := range resp.Topics {
		out[t] = make(map[int]int64, len(parts))
		for _, p := range parts {
			if p.Error != nil {
				return nil, fmt.Errorf("integration: fetch offsets of group %q for %s/%d: %w", group, t, p.Partition, p.Error)
			}
			out[t][p.Partition] = p.CommittedOffset
		}
	}
	return out, nil
}

// Lag is how many messages of a set of topics a group has not committed.
type Lag struct {
	Total int64
	// Behind lists "topic/partition committed/end" for each partition
	// that lags, for error messages.
	Behind []string
}

// GroupLag returns how far group's committed offsets are behind the end of
// the topics.
func (b *Broker) GroupLag(ctx context.Context, group string, topics ...string) (Lag, error) {
	ends, err := b.EndOffsets(ctx, topics...)
	if err != nil {
		return Lag{}, err
	}
	committed, err := b.CommittedOffsets(ctx, group, topics...)
	if err != nil {
		return Lag{}, err
	}
	var lag Lag
	for t, parts := range ends {
		for p, end := range parts {
			c, ok := committed[t][p]
			if !ok || c < 0 {
				c = 0
			}
			if c < end {
				lag.Total += end - c
				lag.Behind = append(lag.Behind, t+"/"+strconv.Itoa(p)+" "+strconv.FormatInt(c, 10)+"/"+strconv.FormatInt(end, 10))
			}
		}
	}
	return lag, nil
}

// WaitCaughtUp polls until group has committed every message of the
// topics, or ctx ends. poll is the interval between checks (default 20ms).
func (b *Broker) WaitCaughtUp(ctx context.Context, group string, poll time.Duration, topics ...string) error {
	if poll <= 0 {
		poll = 20 * time.Millisecond
	}
	var last Lag
	var lastErr error
	for {
		last, lastErr = b.GroupLag(ctx, group, topics...)
		if lastErr == nil && last.Total == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("integration: group %q not caught up: %w (last error: %v)", group, ctx.Err(), lastErr)
			}
			return fmt.Errorf("integration: group %q not caught up: %w; behind: %v", group, ctx.Err(), last.Behind)
		case <-time.After(poll):
		}
	}
}

// Message is one message read back from a topic.
type Message struct {
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   map[string]string
}

// ReadAll reads every message currently in topic (all partitions, from
// offset 0 to the end offset seen when called).
func (b *Broker) ReadAll(ctx context.Context, topic string) ([]Message, error) {
	ends, err := b.EndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []Message
	for p, end := range ends[topic] {
		if end == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   b.addrs,
			Topic:     topic,
			Partition: p,
			MaxWait:   100 * time.Millisecond,
		})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				return nil, fmt.Errorf("integration: read %s/%d: %w", topic, p, err)
			}
			msg := Message{Partition: p, Offset: m.Offset, Key: m.Key, Value: m.Value, Headers: map[string]string{}}
			for _, h := range m.Headers {
				msg.Headers[h.Key] = string(h.Value)
			}
			out = append(out, msg)
			if m.Offset+1 >= end {
				break
			}
		}
		r.Close()
	}
	return out, nil
}
