package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
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
// concurrent use. It speaks to the broker with franz-go, the daemon's own
// Kafka client.
type Broker struct {
	addrs   []string
	cluster *kfake.Cluster // nil when the broker is external
	log     *slog.Logger
	// admin sends every request directly (no cached metadata), so topics
	// created meanwhile are seen at once.
	cl    *kgo.Client
	admin *kadm.Client
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
	b := &Broker{addrs: opts.Addrs, log: log}
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
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...))
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("integration: admin client for %v: %w", b.addrs, err)
	}
	b.cl, b.admin = cl, kadm.NewClient(cl)
	if b.cluster == nil && len(opts.Topics) > 0 {
		if err := b.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
			b.Close()
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
	if b.cl != nil {
		b.cl.Close()
	}
	if b.cluster != nil {
		b.cluster.Close()
	}
}

// CreateTopics creates topics with the given partition count; a topic that
// exists already is not an error.
func (b *Broker) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	resp, err := b.admin.CreateTopics(ctx, int32(partitions), 1, nil, topics...)
	if err != nil {
		return fmt.Errorf("integration: create topics %v: %w", topics, err)
	}
	for topic, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("integration: create topic %q: %w", topic, r.Err)
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
		md, err := b.admin.Metadata(ctx, topics...)
		if err == nil {
			ready := 0
			for _, t := range topics {
				if td, ok := md.Topics[t]; ok && td.Err == nil && len(td.Partitions) > 0 && allLed(td.Partitions) {
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
func allLed(partitions kadm.PartitionDetails) bool {
	for _, p := range partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// Partitions returns how many partitions topic has. A topic created a
// moment ago may be unknown to the broker's metadata; it is asked for
// again for up to a second before it counts as missing.
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
		md, err := b.admin.Metadata(ctx, topic)
		if err != nil {
			return 0, fmt.Errorf("integration: metadata for %q: %w", topic, err)
		}
		lastErr = fmt.Errorf("topic %q not in metadata", topic)
		td, ok := md.Topics[topic]
		switch {
		case !ok:
		case errors.Is(td.Err, kerr.UnknownTopicOrPartition):
			lastErr = td.Err
		case td.Err != nil:
			return 0, fmt.Errorf("integration: metadata for %q: %w", topic, td.Err)
		default:
			return len(td.Partitions), nil
		}
	}
	return 0, fmt.Errorf("integration: metadata for %q: %w", topic, lastErr)
}

// EndOffsets returns the next offset to be written of every partition of
// the topics (the high watermarks), by topic and partition.
func (b *Broker) EndOffsets(ctx context.Context, topics ...string) (map[string]map[int]int64, error) {
	for _, t := range topics {
		if _, err := b.Partitions(ctx, t); err != nil {
			return nil, err
		}
	}
	listed, err := b.admin.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("integration: list offsets: %w", err)
	}
	out := make(map[string]map[int]int64, len(topics))
	for t, parts := range listed {
		out[t] = make(map[int]int64, len(parts))
		for p, o := range parts {
			if o.Err != nil {
				return nil, fmt.Errorf("integration: list offsets %s/%d: %w", t, p, o.Err)
			}
			out[t][int(p)] = o.Offset
		}
	}
	return out, nil
}

// CommittedOffsets returns the offsets group has committed for the topics'
// partitions (-1 where it has committed nothing).
func (b *Broker) CommittedOffsets(ctx context.Context, group string, topics ...string) (map[string]map[int]int64, error) {
	out := make(map[string]map[int]int64, len(topics))
	for _, t := range topics {
		n, err := b.Partitions(ctx, t)
		if err != nil {
			return nil, err
		}
		out[t] = make(map[int]int64, n)
		for p := 0; p < n; p++ {
			out[t][p] = -1
		}
	}
	resp, err := b.admin.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return out, nil // the group has not committed anything yet
	}
	if err != nil {
		return nil, fmt.Errorf("integration: fetch offsets of group %q: %w", group, err)
	}
	for t, parts := range out {
		for p := range parts {
			r, ok := resp.Lookup(t, int32(p))
			if !ok {
				continue
			}
			if r.Err != nil {
				return nil, fmt.Errorf("integration: fetch offsets of group %q for %s/%d: %w", group, t, p, r.Err)
			}
			parts[p] = r.At
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
	// Time is the record's timestamp.
	Time time.Time
}

// ReadAll reads every message currently in topic (all partitions, from
// offset 0 to the end offset seen when called), in partition and offset
// order.
func (b *Broker) ReadAll(ctx context.Context, topic string) ([]Message, error) {
	ends, err := b.EndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	from := make(map[int32]kgo.Offset)
	for p, end := range ends[topic] {
		if end > 0 {
			from[int32(p)] = kgo.NewOffset().AtStart()
		}
	}
	if len(from) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("integration: read %s: %w", topic, err)
	}
	defer cl.Close()
	var out []Message
	for len(from) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("integration: read %s: %w", topic, err)
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			fetchErr = fmt.Errorf("integration: read %s/%d: %w", t, p, err)
		})
		if fetchErr != nil {
			return nil, fetchErr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			p := int(r.Partition)
			if _, reading := from[r.Partition]; !reading || r.Offset >= ends[topic][p] {
				return
			}
			msg := Message{Partition: p, Offset: r.Offset, Key: r.Key, Value: r.Value, Headers: map[string]string{}, Time: r.Timestamp}
			for _, h := range r.Headers {
				msg.Headers[h.Key] = string(h.Value)
			}
			out = append(out, msg)
			if r.Offset+1 >= ends[topic][p] {
				delete(from, r.Partition)
			}
		})
	}
	slices.SortFunc(out, func(a, b Message) int {
		if a.Partition != b.Partition {
			return a.Partition - b.Partition
		}
		return int(a.Offset - b.Offset)
	})
	return out, nil
}
