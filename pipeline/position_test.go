package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// positionedUser is a Debezium change of shop.users row id with the
// source block of a MariaDB server serverID: its GTID (domain 0) and
// binary log position.
func positionedUser(t *testing.T, serverID uint32, seq, binlogPos int64, id int) Message {
	t.Helper()
	ev := map[string]any{
		"op": "u", "ts_ms": 1700000000000, "before": row("id", id), "after": row("id", id),
		"source": map[string]any{"connector": "mysql", "db": "shop", "table": "users", "server_id": serverID,
			"gtid": fmt.Sprintf("0-%d-%d", serverID, seq), "file": "mysql-bin.000003", "pos": binlogPos, "snapshot": false},
	}
	v, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return Message{Value: v, Pos: rules.Position{Topic: "t"}}
}

// positionSpy applies ops with the real writer after reading the
// position item, so the test sees what a reader that saw the bumps could
// read at the latest.
type positionSpy struct {
	Applier
	mc   *memcache.Client
	key  string
	seen []string
}

func (s *positionSpy) Apply(ctx context.Context, ops []rules.Op, res []cacheops.Result) error {
	it, err := s.mc.Get(s.key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		s.seen = append(s.seen, "<missing>")
	case err != nil:
		return err
	default:
		s.seen = append(s.seen, string(it.Value))
	}
	return s.Applier.Apply(ctx, ops, res)
}

// TestPositionWrittenBeforeOps checks that each batch moves its source
// server's position item to the batch's newest position before any of
// its ops is sent, that an older batch (another partition's) never moves
// it back, and that changes without a server_id write nothing.
func TestPositionWrittenBeforeOps(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	serverID := 1_000_000 + rand.Uint32N(1<<30) // the key has no prefix: one of its own
	key := itemformat.PositionKey(serverID)
	t.Cleanup(func() { r.mc.Delete(key) })
	spy := &positionSpy{Applier: cacheops.NewTextApplier(r.mc, nil, nil, cacheops.Config{}, r.log), mc: r.mc, key: key}
	p, err := New(Config{Rules: r.pipeline.cfg.Rules, Writer: spy, Metrics: r.metrics, Logger: r.log,
		Positions: memcachePositions{mc: r.mc}})
	if err != nil {
		t.Fatal(err)
	}
	batches := []struct {
		name string
		msgs []Message
		want string
	}{
		{"the newest of the batch, whatever its order", []Message{
			positionedUser(t, serverID, 12, 900, 1), positionedUser(t, serverID, 11, 700, 2)},
			fmt.Sprintf("gtid=0-%d-12 binlog=mysql-bin.000003:900", serverID)},
		{"an older batch moves nothing", []Message{positionedUser(t, serverID, 5, 300, 3)},
			fmt.Sprintf("gtid=0-%d-12 binlog=mysql-bin.000003:900", serverID)},
		{"no server_id: nothing", []Message{userMessage(t, 0, 4)},
			fmt.Sprintf("gtid=0-%d-12 binlog=mysql-bin.000003:900", serverID)},
		{"a newer batch", []Message{positionedUser(t, serverID, 13, 1000, 1)},
			fmt.Sprintf("gtid=0-%d-13 binlog=mysql-bin.000003:1000", serverID)},
	}
	for i, bt := range batches {
		var b Batch
		if err := p.Process(context.Background(), &b, bt.msgs, CoalesceOptions{}); err != nil {
			t.Fatalf("%s: %v", bt.name, err)
		}
		if len(spy.seen) != i+1 {
			t.Fatalf("%s: the writer was called %d times, want %d", bt.name, len(spy.seen), i+1)
		}
		if got := spy.seen[i]; got != bt.want {
			t.Errorf("%s: position item when the ops were sent = %q, want %q", bt.name, got, bt.want)
		}
	}
	for outcome, want := range map[string]float64{"written": 2, "current": 1, "none": 1} {
		if n := metricValue(r.metrics.sourcePositions.WithLabelValues(outcome)); n != want {
			t.Errorf("cachewarden_source_positions_total{outcome=%q} = %v, want %v", outcome, n, want)
		}
	}
}

// TestPositionAdvanceRaces checks that writers racing on one position
// item (partitions of one source) lose none of each other's positions:
// each writer moves a replication domain of its own, and every domain
// ends at its newest GTID.
func TestPositionAdvanceRaces(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	serverID := 1_000_000 + rand.Uint32N(1<<30)
	key := itemformat.PositionKey(serverID)
	t.Cleanup(func() { r.mc.Delete(key) })
	w := memcachePositions{mc: r.mc}
	const writers, each = 8, 40
	errs := make(chan error, writers)
	for g := range writers {
		go func() {
			for i := range each {
				pos := itemformat.SourcePosition{GTIDs: []itemformat.GTID{{Domain: uint32(g), Server: serverID, Seq: uint64(i + 1)}}}
				if _, err := w.Advance(context.Background(), serverID, pos); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	it, err := r.mc.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	var want itemformat.SourcePosition
	for g := range writers {
		want.GTIDs = append(want.GTIDs, itemformat.GTID{Domain: uint32(g), Server: serverID, Seq: each})
	}
	if got, want := string(it.Value), string(want.Encode()); got != want {
		t.Errorf("position after the race = %q, want %q", got, want)
	}
}
