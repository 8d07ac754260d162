package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Broker is the Kafka-protocol broker the benchmark uses: an external one
// (KAFKA_BROKERS) or a cwbroker process started by the harness.
type Broker struct {
	Addrs []string
	proc  *Process // nil for an external broker
}

// StartBroker starts bin (cwbroker) on a free loopback port and waits for
// it to listen.
func StartBroker(ctx context.Context, bin string, partitions int) (*Broker, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-port", strconv.Itoa(port), "-partitions", strconv.Itoa(partitions))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: broker stdout: %w", err)
	}
	proc, err := startProcess("broker", cmd)
	if err != nil {
		return nil, err
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case line := <-lines:
		addrs, ok := strings.CutPrefix(line, "listening ")
		if !ok {
			_ = proc.Stop(time.Second)
			return nil, fmt.Errorf("bench: broker said %q", line)
		}
		b := &Broker{Addrs: strings.Split(addrs, ","), proc: proc}
		if err := waitDial(ctx, b.Addrs[0], proc, 10*time.Second); err != nil {
			_ = proc.Stop(time.Second)
			return nil, fmt.Errorf("bench: broker: %w", err)
		}
		return b, nil
	case <-proc.done:
		return nil, fmt.Errorf("bench: broker exited: %v", proc.err)
	case <-time.After(30 * time.Second):
		_ = proc.Stop(time.Second)
		return nil, errors.New("bench: broker did not start within 30s")
	case <-ctx.Done():
		_ = proc.Stop(time.Second)
		return nil, ctx.Err()
	}
}

// ExternalBroker uses brokers given as "host:port,host:port".
func ExternalBroker(list string) *Broker {
	var addrs []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return &Broker{Addrs: addrs}
}

// Pid is the broker process id, 0 for an external broker.
func (b *Broker) Pid() int {
	if b.proc == nil {
		return 0
	}
	return b.proc.Pid()
}

// Stop stops a broker the harness started.
func (b *Broker) Stop() error {
	if b.proc == nil {
		return nil
	}
	return b.proc.Stop(10 * time.Second)
}

func (b *Broker) client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(b.Addrs...), Timeout: 30 * time.Second}
}

// CreateTopic creates topic with the given partitions and waits until its
// metadata lists them.
func (b *Broker) CreateTopic(ctx context.Context, topic string, partitions int) error {
	resp, err := b.client().CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		return fmt.Errorf("bench: create topic %q: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("bench: create topic %q: %w", topic, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := b.partitions(ctx, topic)
		if err == nil && n == partitions {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: topic %q: %d partitions after 30s (want %d): %v", topic, n, partitions, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (b *Broker) partitions(ctx context.Context, topic string) (int, error) {
	resp, err := b.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, err
	}
	for _, t := range resp.Topics {
		if t.Name == topic {
			if t.Error != nil {
				return 0, t.Error
			}
			return len(t.Partitions), nil
		}
	}
	return 0, fmt.Errorf("topic %q not in metadata", topic)
}

// EndOffsets returns each partition's high watermark.
func (b *Broker) EndOffsets(ctx context.Context, topic string, partitions int) (map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	resp, err := b.client().ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("bench: list offsets of %q: %w", topic, err)
	}
	out := make(map[int]int64, partitions)
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("bench: list offsets %s/%d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out, nil
}

// Committed returns the sum over the partitions of the offsets group has
// committed on topic (a partition without a commit counts 0).
func (b *Broker) Committed(ctx context.Context, c *kafka.Client, group, topic string, partitions int) (int64, error) {
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	resp, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, fmt.Errorf("bench: committed offsets of %s: %w", group, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("bench: committed offsets of %s: %w", group, resp.Error)
	}
	var sum int64
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return 0, fmt.Errorf("bench: committed offset %s/%d: %w", topic, p.Partition, p.Error)
		}
		if p.CommittedOffset > 0 {
			sum += p.CommittedOffset
		}
	}
	return sum, nil
}
