package testsvc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaTopics returns brokers on which topics exist with the given number
// of partitions: those Kafka returns, with the topics created there, else
// an in-process Kafka-protocol broker (franz-go's kfake) seeded with
// them, closed when the test ends.
func KafkaTopics(t testing.TB, partitions int, topics ...string) []string {
	t.Helper()
	brokers := Kafka()
	if brokers == nil {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(partitions), topics...))
		if err != nil {
			t.Fatalf("start in-process Kafka: %v", err)
		}
		t.Cleanup(c.Close)
		return c.ListenAddrs()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatalf("Kafka %v: %v", brokers, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopics(ctx, int32(partitions), 1, nil, topics...)
	if err != nil {
		t.Fatalf("create topics %v: %v", topics, err)
	}
	for _, r := range resp.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", r.Topic, r.Err)
		}
	}
	// A broker creates topics asynchronously: wait until every partition
	// has a leader, so that the test's first produce finds it.
	for !topicsReady(ctx, adm, partitions, topics) {
		select {
		case <-ctx.Done():
			t.Fatalf("topics %v: no leader for every partition after 30s", topics)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return brokers
}

// topicsReady reports whether every partition of topics has a leader.
func topicsReady(ctx context.Context, adm *kadm.Client, partitions int, topics []string) bool {
	md, err := adm.Metadata(ctx, topics...)
	if err != nil {
		return false
	}
	for _, topic := range topics {
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil || len(td.Partitions) < partitions {
			return false
		}
		for _, p := range td.Partitions {
			if p.Err != nil || p.Leader < 0 {
				return false
			}
		}
	}
	return true
}
