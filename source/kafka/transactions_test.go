package kafka

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// Transactional producers (Debezium with exactly-once source support,
// Kafka Connect KIP-618, and many others) write CDC topics in
// transactions. These tests produce with franz-go's transactional
// producer and check that the daemon applies exactly the committed
// transactions: no aborted record is planned, no transaction marker
// reaches decoding or the DLQ, and an open transaction neither fails the
// partition nor lets anything past it be applied.

const txnRules = `
version: 1
prefix: "PREFIX"
rules:
  - name: user-interests
    table: shop.user_interests
    set:
      key: "interests:{user_id}"
      member: "{interest_id}"
`

// txnProducer returns a transactional producer compressing with codec,
// writing to the partition each record names.
func txnProducer(t *testing.T, brokers []string, codec kgo.CompressionCodec) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.TransactionalID("cw-txn-"+testsvc.Unique()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(codec),
		kgo.ProducerLinger(0),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// interestRecord is a Debezium insert of (user, interest) on partition p.
func interestRecord(topic string, p int32, user, interest int) *kgo.Record {
	m := debezium("c", "shop", "user_interests", nil, row("user_id", user, "interest_id", interest))
	key := fmt.Sprintf(`{"user_id":%d,"interest_id":%d}`, user, interest)
	return &kgo.Record{Topic: topic, Partition: p, Key: []byte(key), Value: m.Value}
}

// transact produces recs in one transaction and commits or aborts it.
func transact(t *testing.T, cl *kgo.Client, commit bool, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin transaction: %v", err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce in transaction: %v", err)
	}
	end := kgo.TryAbort
	if commit {
		end = kgo.TryCommit
	}
	if err := cl.EndTransaction(ctx, end); err != nil {
		t.Fatalf("end transaction (commit %v): %v", commit, err)
	}
}

// members returns the members a set item holds (its last token wins).
func members(item string) map[string]bool {
	out := make(map[string]bool)
	for _, tok := range strings.Fields(item) {
		out[tok[1:]] = tok[0] == '+'
	}
	for m, in := range out {
		if !in {
			delete(out, m)
		}
	}
	return out
}

// TestTransactionsReadCommitted interleaves committed and aborted
// transactions over three partitions, with every compression codec, and
// checks that exactly the committed ones are applied and that nothing is
// poison.
func TestTransactionsReadCommitted(t *testing.T) {
	for _, codec := range []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()},
		{"gzip", kgo.GzipCompression()},
		{"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()},
		{"zstd", kgo.ZstdCompression()},
	} {
		t.Run(codec.name, func(t *testing.T) {
			topic := "cdc-txn-" + testsvc.Unique()
			group := "cw-" + testsvc.Unique()
			brokers := testsvc.KafkaTopics(t, 3, topic)
			r := newRig(t, txnRules, rigOptions{})
			const users = 6 // users 0..5; user u's events go to partition u%3
			for u := range users {
				r.set("interests:"+strconv.Itoa(u), "")
			}
			prod := txnProducer(t, brokers, codec.codec)
			want := make(map[int]map[string]bool)
			committedEvents := 0
			for txn := range 12 {
				commit := txn%3 != 1 // every third transaction aborts
				var recs []*kgo.Record
				for u := range users {
					if (u+txn)%2 == 0 {
						continue
					}
					interest := 100*txn + u
					recs = append(recs, interestRecord(topic, int32(u%3), u, interest))
					if commit {
						if want[u] == nil {
							want[u] = make(map[string]bool)
						}
						want[u][strconv.Itoa(interest)] = true
						committedEvents++
					}
				}
				transact(t, prod, commit, recs...)
			}
			_, stop := r.daemon(brokers, group, topic)
			waitFor(t, 30*time.Second, func() string {
				for u := range users {
					if got := members(r.get("interests:" + strconv.Itoa(u))); len(got) < len(want[u]) {
						return fmt.Sprintf("user %d: %d of %d members", u, len(got), len(want[u]))
					}
				}
				return ""
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			for u := range users {
				got := members(r.get("interests:" + strconv.Itoa(u)))
				for m := range got {
					if !want[u][m] {
						t.Errorf("user %d: member %s of an aborted transaction was applied", u, m)
					}
				}
				for m := range want[u] {
					if !got[m] {
						t.Errorf("user %d: member %s of a committed transaction is missing", u, m)
					}
				}
			}
			if got := testsvc.Metric(t, r.reg, "cachewarden_events_total", "topic="+topic, "format=debezium", "outcome=planned"); int(got) != committedEvents {
				t.Errorf("planned events = %v, want %d (the committed ones)", got, committedEvents)
			}
			poison := 0.0
			for _, f := range []string{"auto", "debezium"} {
				poison += testsvc.Metric(t, r.reg, "cachewarden_events_total", "topic="+topic, "format="+f, "outcome=poison")
			}
			if poison != 0 {
				t.Errorf("poison events = %v, want 0: transaction markers reached decoding", poison)
			}
		})
	}
}

// TestOpenTransaction holds a transaction open while the daemon runs:
// nothing past the last stable offset is applied or committed, the
// partition neither fails nor rejoins, and once the transaction ends its
// records (or, aborted, none of them) and those behind it are applied —
// also by a daemon that took over in the middle of the transaction.
func TestOpenTransaction(t *testing.T) {
	for _, outcome := range []string{"commit", "abort"} {
		t.Run(outcome, func(t *testing.T) {
			topic := "cdc-open-" + testsvc.Unique()
			group := "cw-" + testsvc.Unique()
			brokers := testsvc.KafkaTopics(t, 1, topic)
			r := newRig(t, txnRules, rigOptions{})
			r.set("interests:1", "")
			prod := txnProducer(t, brokers, kgo.NoCompression())
			transact(t, prod, true, interestRecord(topic, 0, 1, 1), interestRecord(topic, 0, 1, 2))

			d, stop := r.daemon(brokers, group, topic)
			waitFor(t, 20*time.Second, func() string {
				if got := members(r.get("interests:1")); !got["1"] || !got["2"] {
					return "committed transaction not applied yet: " + r.get("interests:1")
				}
				return ""
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := prod.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			open, err := prod.ProduceSync(ctx, interestRecord(topic, 0, 1, 100)).First()
			if err != nil {
				t.Fatal(err)
			}
			openOffset := open.Offset
			// A record of another producer behind the open transaction.
			produce(t, brokers, topic, debezium("c", "shop", "user_interests", nil, row("user_id", 1, "interest_id", 6)))

			// Seconds of an open transaction: several fetch rounds.
			time.Sleep(3 * time.Second)
			if got := members(r.get("interests:1")); got["100"] || got["6"] {
				t.Errorf("records past the last stable offset applied: %q", r.get("interests:1"))
			}
			if off, _ := committedMeta(t, brokers, group, topic, 0); off > openOffset {
				t.Errorf("committed offset %d past the open transaction's first record %d", off, openOffset)
			}
			if n := metricValue(r.metrics.partitionErrors); n != 0 {
				t.Errorf("partition errors = %v, want 0", n)
			}
			if n := metricValue(r.metrics.generations); n != 1 {
				t.Errorf("assignments = %v, want 1 (no rejoin while the transaction is open)", n)
			}
			if !d.Ready() {
				t.Errorf("not ready while a transaction is open: %v", d.Stalled())
			}

			// Hand over in the middle of the transaction.
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			_, stop2 := r.daemon(brokers, group, topic)
			defer stop2()
			end := kgo.TryAbort
			if outcome == "commit" {
				end = kgo.TryCommit
			}
			if err := prod.EndTransaction(ctx, end); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 20*time.Second, func() string {
				if got := members(r.get("interests:1")); !got["6"] {
					return "record behind the transaction not applied: " + r.get("interests:1")
				}
				return ""
			})
			if got := members(r.get("interests:1"))["100"]; got != (outcome == "commit") {
				t.Errorf("after %s, member 100 applied = %v: %q", outcome, got, r.get("interests:1"))
			}
			if strings.Contains(r.logs.String(), "level=ERROR") {
				t.Errorf("errors logged around an open transaction")
			}
		})
	}
}
