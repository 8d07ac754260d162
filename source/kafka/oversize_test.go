package kafka

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPollSkipsOversizedBatch: a batch that decompresses past
// KafkaConn.MaxDecompressedBatchBytes reaches its partition's queue as one
// message standing for it (OversizedBatch, at the batch's last offset),
// and the records after it follow, in order. The DLQ record written for it
// names the batch's offsets and holds no key or value.
func TestPollSkipsOversizedBatch(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "bombs"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	produce := func(codec kgo.CompressionCodec, recs ...*kgo.Record) {
		t.Helper()
		prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("bombs"),
			kgo.ProducerBatchCompression(codec), kgo.ProducerBatchMaxBytes(8<<20), kgo.ProducerLinger(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer prod.Close()
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	zeros := make([]byte, 1<<20)
	produce(kgo.NoCompression(), &kgo.Record{Value: []byte("before")})
	// Three records of 1 MiB of zeros in one batch of a few KB: 3 MiB
	// decompressed, over a 2 MiB bound.
	produce(kgo.GzipCompression(), &kgo.Record{Value: zeros}, &kgo.Record{Value: zeros}, &kgo.Record{Value: zeros})
	produce(kgo.NoCompression(), &kgo.Record{Value: []byte("after")})

	log, _ := testLogger(t)
	cl, err := KafkaConn{Brokers: cluster.ListenAddrs(), MaxDecompressedBatchBytes: 2 << 20}.NewClient(log,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"bombs": {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	q := newPartitionQueue("bombs", 0, nil, nil)
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollLoop(pctx, cl, func(string, int32) *partitionQueue { return q }, slog.New(slog.DiscardHandler))
	}()
	src := batchSource{q: q}
	var all []pipeline.Message
	for len(all) < 3 {
		if _, err := src.receive(ctx, nil); err != nil {
			t.Fatalf("after %d messages: %v", len(all), err)
		}
		all, _ = src.take(all, len(src.pending), false)
	}
	stop()
	<-done
	if string(all[0].Value) != "before" || string(all[2].Value) != "after" || all[2].Pos.Offset != 4 {
		t.Fatalf("messages %+v, want before, the batch, after at offset 4", all)
	}
	var ob *OversizedBatch
	if !errors.As(all[1].Failed, &ob) || all[1].Pos.Offset != 3 || len(all[1].Value) != 0 {
		t.Fatalf("message 1: %+v, want an oversized batch at offset 3", all[1])
	}
	if ob.FirstOffset != 1 || ob.EndOffset != 4 || ob.Limit != 2<<20 || ob.CompressedBytes <= 0 || ob.CompressedBytes > 64<<10 {
		t.Errorf("oversized batch %+v, want offsets 1 to 4, limit 2 MiB and its compressed size", ob)
	}
	t.Logf("poison: %v", all[1].Failed)
	rec := dlqRecord(&pipeline.Poison{Message: all[1], Err: all[1].Failed})
	h := map[string]string{}
	for _, kv := range rec.Headers {
		h[kv.Key] = string(kv.Value)
	}
	if h[HeaderOffset] != "1" || h[HeaderEndOffset] != "4" || h[HeaderTopic] != "bombs" || h[HeaderPartition] != "0" ||
		!strings.Contains(h[HeaderError], "decompresses to more than 2097152 bytes") || rec.Value != nil || rec.Key != nil {
		t.Errorf("dead letter %+v, headers %v", rec, h)
	}
}

// TestDaemonOversizedFirstBatch runs the daemon on a partition whose very
// first batch decompresses past the bound, with no commit of its group:
// the Kafka client cannot be moved past such a batch, so the daemon
// commits past it, reports the partition stopped (/readyz), and the next
// daemon of the group continues after it.
func TestDaemonOversizedFirstBatch(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "first"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("first"),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: make([]byte, 3<<20)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("not JSON")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, daemonRules, rigOptions{})
	small := func(c *Config) { c.Kafka.MaxDecompressedBatchBytes = 2 << 20 }
	d, stop := r.daemonWith(brokers, "first-group", small, "first")
	waitCommitted(t, brokers, "first-group", "first", 1)
	waitFor(t, 20*time.Second, func() string {
		for _, s := range d.NotReady() {
			if strings.Contains(s, "cannot skip a batch") {
				return ""
			}
		}
		return "not ready reasons: " + strings.Join(d.NotReady(), "; ")
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The next daemon of the group starts past the batch.
	_, stop = r.daemonWith(brokers, "first-group", small, "first")
	waitCommitted(t, brokers, "first-group", "first", 2)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
