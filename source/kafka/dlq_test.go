package kafka

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// TestDLQOldRecords writes poison messages whose records are hours old:
// the client times a produce out from the record's timestamp, so the DLQ
// record is stamped when written and the original time travels in the
// cachewarden.timestamp header.
func TestDLQOldRecords(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, _ := testLogger(t)
	conn := KafkaConn{Brokers: c.ListenAddrs()}
	d, err := NewDLQ(conn, "dlq", log)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	old := time.Now().Add(-3 * time.Hour).Truncate(time.Millisecond)
	poison := []pipeline.Poison{
		{Message: pipeline.Message{Key: []byte("k1"), Value: []byte("cut short"), Time: old,
			Pos: rules.Position{Topic: "cdc.shop.users", Partition: 0, Offset: 7}}, Err: errors.New("bad JSON")},
		{Message: pipeline.Message{Key: []byte("k2"), Value: []byte("no key"), Time: old.Add(time.Second),
			Pos: rules.Position{Topic: "cdc.shop.users", Partition: 0, Offset: 8}}, Err: errors.New("no id")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*dlqDeliveryTimeout)
	defer cancel()
	sent := time.Now()
	if err := d.Send(ctx, poison); err != nil {
		t.Fatalf("write poison messages 3 hours old: %v", err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"dlq": {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	for len(got) < len(poison) && ctx.Err() == nil {
		got = append(got, cl.PollFetches(ctx).Records()...)
	}
	if len(got) != len(poison) {
		t.Fatalf("dead-letter topic holds %d records, want %d", len(got), len(poison))
	}
	for i, r := range got {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if want := strconv.FormatInt(poison[i].Message.Time.UnixMilli(), 10); h[HeaderTimestamp] != want {
			t.Errorf("record %d: %s = %q, want %s", i, HeaderTimestamp, h[HeaderTimestamp], want)
		}
		if r.Timestamp.Before(sent.Add(-time.Minute)) {
			t.Errorf("record %d: timestamp %v, want the time it was written (about %v)", i, r.Timestamp, sent)
		}
		if h[HeaderOffset] != strconv.FormatInt(poison[i].Message.Pos.Offset, 10) {
			t.Errorf("record %d: headers %v", i, h)
		}
	}
}

// TestDLQUnwritable checks that a DLQ that cannot be written fails with
// an error naming the topic and the cause: the topic is missing (and the
// brokers do not create topics), or the brokers are gone.
func TestDLQUnwritable(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "cdc"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, _ := testLogger(t)
	p := []pipeline.Poison{{Message: pipeline.Message{Value: []byte("x"), Time: time.Now().Add(-time.Hour),
		Pos: rules.Position{Topic: "cdc", Offset: 1}}, Err: errors.New("bad")}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	missing, err := newDLQ(KafkaConn{Brokers: c.ListenAddrs()}, "no-such-dlq", log, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	err = missing.Send(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "no-such-dlq") || !strings.Contains(err.Error(), "UNKNOWN_TOPIC_OR_PARTITION") {
		t.Errorf("write to a missing topic: %v; want an error naming no-such-dlq and UNKNOWN_TOPIC_OR_PARTITION", err)
	}
	t.Logf("missing topic: %v", err)

	// The brokers go away after the DLQ has written once: the records
	// time out inside the client, which names no cause by itself.
	c2, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dlq"))
	if err != nil {
		t.Fatal(err)
	}
	down, err := newDLQ(KafkaConn{Brokers: c2.ListenAddrs(), DialTimeout: time.Second}, "dlq", log, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	if err := down.Send(ctx, p); err != nil {
		t.Fatal(err)
	}
	c2.Close()
	err = down.Send(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "to dlq:") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("write with the brokers down: %v; want an error naming dlq and the refused connection", err)
	}
	t.Logf("brokers down: %v", err)
}
