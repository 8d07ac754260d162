package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fetchRig reads partition 0 of topic with a partitionReader.
type fetchRig struct {
	t    *testing.T
	r    *partitionReader
	src  batchSource
	next int64 // offset expected next
}

func startFetcher(t *testing.T, brokers []string, topic string, offset int64) *fetchRig {
	t.Helper()
	log, _ := testLogger(t)
	pr, err := startPartitionReader(context.Background(), KafkaConn{Brokers: brokers}, topic, 0, offset, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pr.stop)
	return &fetchRig{t: t, r: pr, src: batchSource{q: pr.q}}
}

// expect receives n messages and checks that they are the partition's
// next ones, in order, with the values produceSeq gave them.
func (r *fetchRig) expect(from int64, n int) {
	r.t.Helper()
	r.next = from
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for got := 0; got < n; {
		if len(r.src.pending) == 0 {
			if _, err := r.src.receive(ctx, nil); err != nil {
				r.t.Fatalf("after %d of %d messages: %v", got, n, err)
			}
		}
		var msgs []pipeline.Message
		msgs, _ = r.src.take(msgs, n-got, false)
		for _, m := range msgs {
			if m.Pos.Offset != r.next {
				r.t.Fatalf("offset %d, want %d", m.Pos.Offset, r.next)
			}
			if want := "v" + strconv.FormatInt(m.Pos.Offset, 10); string(m.Value) != want {
				r.t.Fatalf("offset %d: value %q, want %q", m.Pos.Offset, m.Value, want)
			}
			if m.Pos.Topic == "" || m.Pos.Partition != 0 {
				r.t.Fatalf("offset %d: position %+v", m.Pos.Offset, m.Pos)
			}
			if r.src.stable <= m.Pos.Offset {
				r.t.Fatalf("offset %d: last stable offset %d not beyond it", m.Pos.Offset, r.src.stable)
			}
			r.next++
			got++
		}
	}
}

// expectNothing checks that no message arrives for a while.
func (r *fetchRig) expectNothing(d time.Duration) {
	r.t.Helper()
	if len(r.src.pending) > 0 {
		r.t.Fatalf("%d unexpected messages pending", len(r.src.pending))
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	ok, err := r.src.receive(context.Background(), timer.C)
	if ok || err != nil {
		r.t.Fatalf("unexpected delivery: %d messages, err %v", len(r.src.pending), err)
	}
}

// produceSeq appends n messages to partition 0 of topic; the message at
// offset o has the value "v<o>" (the partition must hold `from`
// messages).
func produceSeq(t *testing.T, brokers []string, topic string, from, n int) {
	t.Helper()
	produceSeqKeyed(t, brokers, topic, from, n, 0)
}

// produceSeqKeyed is produceSeq with a key of keyBytes bytes on every
// message.
func produceSeqKeyed(t *testing.T, brokers []string, topic string, from, n, keyBytes int) {
	t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: 0, Value: []byte(fmt.Sprintf("v%d", from+i))}
		if keyBytes > 0 {
			msgs[i].Key = bytes.Repeat([]byte{'k'}, keyBytes)
		}
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

func TestReaderDeliversInOrder(t *testing.T) {
	brokers := testsvc.KafkaTopics(t, 1, "fetch-order")
	produceSeq(t, brokers, "fetch-order", 0, 1234)

	t.Run("first offset", func(t *testing.T) {
		r := startFetcher(t, brokers, "fetch-order", 0)
		r.expect(0, 1234)
		r.expectNothing(200 * time.Millisecond)
	})
	t.Run("absolute offset", func(t *testing.T) {
		r := startFetcher(t, brokers, "fetch-order", 1000)
		r.expect(1000, 234)
	})
	t.Run("end offset waits for new messages", func(t *testing.T) {
		r := startFetcher(t, brokers, "fetch-order", 1234)
		r.expectNothing(300 * time.Millisecond)
		produceSeq(t, brokers, "fetch-order", 1234, 3)
		r.expect(1234, 3)
	})
}

// TestReaderPausesWhenBehind lets more than queueLimitBytes of messages
// wait without taking them: fetching pauses (messages produced meanwhile are
// not fetched), and every message arrives once, in order, after the
// reader takes them.
func TestReaderPausesWhenBehind(t *testing.T) {
	brokers := testsvc.KafkaTopics(t, 1, "fetch-pause")
	// 3,000 messages of 2 KiB: more than a partition's queue holds.
	produceSeqKeyed(t, brokers, "fetch-pause", 0, 3000, 2<<10)
	r := startFetcher(t, brokers, "fetch-pause", 0)
	waiting := func() (bool, int) {
		r.r.q.mu.Lock()
		defer r.r.q.mu.Unlock()
		return r.r.q.paused, len(r.r.q.msgs)
	}
	deadline := time.Now().Add(10 * time.Second)
	for paused, n := waiting(); !paused; paused, n = waiting() {
		if time.Now().After(deadline) {
			t.Fatalf("not paused with %d messages waiting", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	produceSeq(t, brokers, "fetch-pause", 3000, 2000)
	time.Sleep(500 * time.Millisecond) // several fetch rounds, were it fetching
	if _, n := waiting(); n > 3000 {
		t.Fatalf("%d messages waiting: fetching went on while paused", n)
	}
	r.expect(0, 5000)
}

// TestReaderFollowsLeader moves the partition to another broker while
// the reader reads it: it goes on at the new leader without a gap, a
// repeat or an error.
func TestReaderFollowsLeader(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(1, "fetch-move"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	produceSeq(t, brokers, "fetch-move", 0, 700)
	r := startFetcher(t, brokers, "fetch-move", 0)
	r.expect(0, 700)

	leader := c.LeaderFor("fetch-move", 0)
	if err := c.MoveTopicPartition("fetch-move", 0, (leader+1)%3); err != nil {
		t.Fatalf("move partition: %v", err)
	}
	produceSeq(t, brokers, "fetch-move", 700, 300)
	r.expect(700, 300)
}

// TestReaderReportsDeletedStart starts before the partition's first
// offset (records deleted by retention): the reader reports the offset
// out of range instead of skipping the deleted records silently.
func TestReaderReportsDeletedStart(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "fetch-deleted"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	produceSeq(t, brokers, "fetch-deleted", 0, 200)
	deleteRecords(t, brokers, "fetch-deleted", 0, 150)

	r := startFetcher(t, brokers, "fetch-deleted", 20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = r.src.receive(ctx, nil)
	if !errors.Is(err, kerr.OffsetOutOfRange) {
		t.Fatalf("receive: %v, want OFFSET_OUT_OF_RANGE", err)
	}
}

// deleteRecords removes the records of topic/partition before offset, as
// retention does.
func deleteRecords(t *testing.T, brokers []string, topic string, partition int32, before int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, before
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("delete records: %v", kerr.ErrorForCode(code))
	}
}

// TestReaderStopsWhenCancelled stops a reader whose fetch waits on the
// broker: stop returns promptly.
func TestReaderStopsWhenCancelled(t *testing.T) {
	brokers := testsvc.KafkaTopics(t, 1, "fetch-stop")
	produceSeq(t, brokers, "fetch-stop", 0, 10)
	r := startFetcher(t, brokers, "fetch-stop", 0)
	r.expect(0, 10)
	stopped := make(chan struct{})
	go func() {
		r.r.stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader has not stopped 5s after cancellation")
	}
}

// countingPool is a recordPool that counts the slices the client takes
// and gives back.
type countingPool struct {
	recordPool
	gets, puts *atomic.Int64
}

func (p countingPool) GetRecords(n int) []kgo.Record {
	p.gets.Add(1)
	return p.recordPool.GetRecords(n)
}

func (p countingPool) PutRecords(rs []kgo.Record) {
	p.puts.Add(1)
	p.recordPool.PutRecords(rs)
}

// TestPollRecyclesRecords: pollLoop recycles every record it hands over,
// so the client's record slices go back to the pool and are reused, and
// the messages keep their keys and values (compressed batches included)
// after the slices were reused for later fetches.
func TestPollRecyclesRecords(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "recycled"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const batches, perBatch = 30, 50
	for b := range batches {
		codec := kgo.NoCompression()
		if b%2 == 1 {
			codec = kgo.Lz4Compression()
		}
		prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("recycled"),
			kgo.ProducerBatchCompression(codec), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for i := range perBatch {
			n := b*perBatch + i
			recs = append(recs, &kgo.Record{Partition: 0, Key: []byte("k" + strconv.Itoa(n)), Value: []byte("v" + strconv.Itoa(n))})
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		prod.Close()
	}
	pool := countingPool{recordPool: newRecordPool(), gets: new(atomic.Int64), puts: new(atomic.Int64)}
	cl, err := KafkaConn{Brokers: cluster.ListenAddrs()}.NewClient(slog.New(slog.DiscardHandler),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"recycled": {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxBytes(1000), kgo.FetchMaxPartitionBytes(1000), // one batch per fetch
		kgo.WithPools(pool))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	q := newPartitionQueue("recycled", 0, nil, nil)
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollLoop(pctx, cl, func(string, int32) *partitionQueue { return q }, slog.New(slog.DiscardHandler))
	}()
	src := batchSource{q: q}
	var all []pipeline.Message
	for len(all) < batches*perBatch {
		if _, err := src.receive(ctx, nil); err != nil {
			t.Fatalf("after %d messages: %v", len(all), err)
		}
		all, _ = src.take(all, len(src.pending), false)
	}
	stop()
	<-done
	for i, m := range all {
		if string(m.Key) != "k"+strconv.Itoa(i) || string(m.Value) != "v"+strconv.Itoa(i) || m.Pos.Offset != int64(i) {
			t.Fatalf("message %d: key %q value %q offset %d", i, m.Key, m.Value, m.Pos.Offset)
		}
	}
	if gets, puts := pool.gets.Load(), pool.puts.Load(); gets < batches || puts < gets-1 {
		t.Errorf("the client took %d record slices from the pool and gave %d back, want at least %d and all but the last", gets, puts, batches)
	}
}

// TestPartitionQueueReusesClearedSlices: a slice handed back to take is
// reused for the next messages and holds none of the old ones, within
// its length or beyond it (take clears only the length it handed out).
func TestPartitionQueueReusesClearedSlices(t *testing.T) {
	q := newPartitionQueue("t", 0, nil, nil)
	recs := func(n int, from int64) []*kgo.Record {
		var rs []*kgo.Record
		for i := range n {
			rs = append(rs, &kgo.Record{Topic: "t", Offset: from + int64(i), Value: []byte("v")})
		}
		return rs
	}
	var given []pipeline.Message
	reused := false
	var next int64
	for round, n := range []int{5, 2, 1, 3, 1, 6, 1} {
		q.push(recs(n, next), -1, -1)
		next += int64(n)
		msgs, _, _, err := q.take(given)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != n || msgs[0].Pos.Offset != next-int64(n) {
			t.Fatalf("round %d: took %d messages from %d, want %d from %d", round, len(msgs), msgs[0].Pos.Offset, n, next-int64(n))
		}
		for i, m := range msgs[:cap(msgs)][n:] {
			if m.Value != nil {
				t.Errorf("round %d: slot %d beyond the %d messages taken still holds offset %d", round, n+i, n, m.Pos.Offset)
			}
		}
		reused = reused || cap(msgs) > n
		given = msgs
	}
	if !reused {
		t.Error("no slice was reused with room beyond its messages; the test shows nothing")
	}
}
