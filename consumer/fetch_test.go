package consumer

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchRig runs a partitionFetcher on partition 0 of topic.
type fetchRig struct {
	t    *testing.T
	f    *partitionFetcher
	stop func()
	next int64 // offset expected next
}

func startFetcher(t *testing.T, brokers []string, topic string, offset int64) *fetchRig {
	t.Helper()
	log, _ := testLogger(t)
	r := &fetchRig{t: t}
	r.f, r.stop = startPartitionFetcher(context.Background(), KafkaConn{Brokers: brokers}, topic, 0, offset, log)
	t.Cleanup(r.stop)
	return r
}

// expect receives n messages and checks that they are the partition's
// next ones, in order, with the values produceSeq gave them.
func (r *fetchRig) expect(from int64, n int) {
	r.t.Helper()
	r.next = from
	deadline := time.After(20 * time.Second)
	for got := 0; got < n; {
		select {
		case c, ok := <-r.f.chunks:
			if !ok {
				r.t.Fatalf("fetcher stopped after %d of %d messages", got, n)
			}
			if c.err != nil {
				r.t.Fatalf("fetch error after %d of %d messages: %v", got, n, c.err)
			}
			if len(c.msgs) == 0 || len(c.msgs) > fetchChunk {
				r.t.Fatalf("chunk of %d messages, want 1..%d", len(c.msgs), fetchChunk)
			}
			for _, m := range c.msgs {
				if m.Pos.Offset != r.next {
					r.t.Fatalf("offset %d, want %d", m.Pos.Offset, r.next)
				}
				if want := "v" + strconv.FormatInt(m.Pos.Offset, 10); string(m.Value) != want {
					r.t.Fatalf("offset %d: value %q, want %q", m.Pos.Offset, m.Value, want)
				}
				if m.Pos.Topic == "" || m.Pos.Partition != 0 {
					r.t.Fatalf("offset %d: position %+v", m.Pos.Offset, m.Pos)
				}
				if c.highWater <= m.Pos.Offset {
					r.t.Fatalf("offset %d: high watermark %d not beyond it", m.Pos.Offset, c.highWater)
				}
				r.next++
				got++
			}
			r.f.recycle(c.msgs)
		case <-deadline:
			r.t.Fatalf("received %d of %d messages", got, n)
		}
	}
}

// expectNothing checks that no message arrives for a while.
func (r *fetchRig) expectNothing(d time.Duration) {
	r.t.Helper()
	select {
	case c := <-r.f.chunks:
		r.t.Fatalf("unexpected chunk: %d messages, err %v", len(c.msgs), c.err)
	case <-time.After(d):
	}
}

// produceSeq appends n messages to partition 0 of topic; the message at
// offset o has the value "v<o>" (the partition must hold `from`
// messages).
func produceSeq(t *testing.T, brokers []string, topic string, from, n int) {
	t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: 0, Value: []byte(fmt.Sprintf("v%d", from+i))}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: partitionZero{}, BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

type partitionZero struct{}

func (partitionZero) Balance(kafka.Message, ...int) int { return 0 }

func TestFetcherDeliversInOrder(t *testing.T) {
	brokers := testKafka(t, 1, "fetch-order")
	produceSeq(t, brokers, "fetch-order", 0, 1234)

	t.Run("first offset", func(t *testing.T) {
		r := startFetcher(t, brokers, "fetch-order", kafka.FirstOffset)
		r.expect(0, 1234)
		r.expectNothing(200 * time.Millisecond)
	})
	t.Run("absolute offset", func(t *testing.T) {
		r := startFetcher(t, brokers, "fetch-order", 1000)
		r.expect(1000, 234)
	})
	t.Run("last offset waits for new messages", func(t *testing.T) {
		r := startFetcher(t, brokers, "fetch-order", kafka.LastOffset)
		r.expectNothing(300 * time.Millisecond)
		produceSeq(t, brokers, "fetch-order", 1234, 3)
		r.expect(1234, 3)
	})
}

// TestFetcherFollowsLeader moves the partition to another broker while
// the fetcher reads it: it reconnects to the new leader and goes on
// without a gap, a repeat or an error.
func TestFetcherFollowsLeader(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(1, "fetch-move"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	produceSeq(t, brokers, "fetch-move", 0, 700)
	r := startFetcher(t, brokers, "fetch-move", kafka.FirstOffset)
	r.expect(0, 700)

	leader := c.LeaderFor("fetch-move", 0)
	if err := c.MoveTopicPartition("fetch-move", 0, (leader+1)%3); err != nil {
		t.Fatalf("move partition: %v", err)
	}
	produceSeq(t, brokers, "fetch-move", 700, 300)
	r.expect(700, 300)
}

// TestFetcherSkipsDeletedRecords starts before the partition's first
// offset (records deleted by retention): it continues at the first.
func TestFetcherSkipsDeletedRecords(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "fetch-deleted"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	produceSeq(t, brokers, "fetch-deleted", 0, 200)

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = "fetch-deleted"
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = 0, 150
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("delete records: error code %d", code)
	}

	r := startFetcher(t, brokers, "fetch-deleted", 20)
	r.expect(150, 50)
}

// TestFetcherStopsWhenCancelled cancels a fetcher whose fetch waits on the
// broker: the pending read is abandoned and the chunk channel closed.
func TestFetcherStopsWhenCancelled(t *testing.T) {
	brokers := testKafka(t, 1, "fetch-stop")
	produceSeq(t, brokers, "fetch-stop", 0, 10)
	r := startFetcher(t, brokers, "fetch-stop", kafka.FirstOffset)
	r.expect(0, 10)
	go r.stop()
	select {
	case _, ok := <-r.f.chunks:
		if ok {
			t.Fatal("a chunk after cancellation")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the chunk channel is still open 5s after cancellation")
	}
}

func TestFetchRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kafka.NotLeaderForPartition, true},
		{fmt.Errorf("wrapped: %w", kafka.LeaderNotAvailable), true},
		{kafka.TopicAuthorizationFailed, false},
		{kafka.InvalidMessage, false},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("read tcp: connection reset by peer"), true},
	} {
		if got := fetchRetryable(tc.err); got != tc.want {
			t.Errorf("fetchRetryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	if fetchBackoff(1) != fetchBackoffMin || fetchBackoff(100) != fetchBackoffMax || fetchBackoff(2) != 2*fetchBackoffMin {
		t.Errorf("backoff 1, 2, 100 = %v, %v, %v", fetchBackoff(1), fetchBackoff(2), fetchBackoff(100))
	}
}
