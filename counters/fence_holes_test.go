package counters

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// Three ways a fenced counter could go wrong, each reproduced against the
// real memcached and MariaDB with its binary log on; the other writer acts
// at a fault point (Counters.faultPoint) between two round trips.

// frozenSnapshot answers every recount with a count taken earlier: a
// writer whose snapshot is older than its store.
type frozenSnapshot struct{ sc SnapshotCount }

func (f frozenSnapshot) Count(context.Context, string, []rules.Value) (int64, error) {
	return f.sc.N, nil
}

func (f frozenSnapshot) CountInSnapshot(context.Context, string, []rules.Value, SnapshotOptions) (SnapshotCount, error) {
	return f.sc, nil
}

// TestCoalescedDeltaLostAddRace: a batch holds two deltas for a missing
// counter, P1 and P2; coalesced, they are one +2 op carrying P1's source.
// The daemon recounts (both rows in), stores its fence, and before its add
// a reader whose snapshot is older (P1 in, P2 not) stores its fence and
// value. The add loses; the winner's fence is at or after P1, but P2's
// change is not in the winner's value.
func TestCoalescedDeltaLostAddRace(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	ctx := context.Background()
	k := e.key("comments:21")
	p1 := b.insert(21)
	early, err := b.m.CountInSnapshot(ctx, commentsQuery, []rules.Value{intValue("21")}, SnapshotOptions{})
	if err != nil || !early.At.Known() {
		t.Fatalf("early snapshot = %+v, %v", early, err)
	}
	p2 := b.insert(21)
	reader := New(e.mc, frozenSnapshot{early}, Config{}, nil)
	daemon := New(e.mc, b.m, Config{}, nil)
	raced := false
	daemon.faultPoint = func(verb, key string) {
		if verb == "add" && key == k && !raced {
			raced = true
			if n, err := reader.Get(ctx, k, commentsQuery, 21); err != nil || n != 1 {
				t.Errorf("reader Get = %d, %v; want 1", n, err)
			}
		}
	}
	var d DeltaFence
	process(t, daemon, &d, []rules.Op{positioned(k, 1, 21, p1), positioned(k, 1, 21, p2)})
	if !raced {
		t.Fatal("the fault point never ran: the daemon did not add the counter")
	}
	e.wantExact(b, k, 21)
}

// TestFenceEvictedAlone: memcached evicts per slab class, so a fence can go
// while its counter stays. A delta the recount already holds must not be
// applied on top of it.
func TestFenceEvictedAlone(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:22")
	b.insert(22)
	inFlight := b.insert(22)
	wantOutcomes(t, apply(t, c, recountOp(k, "22")), cacheops.OutcomeRecounted)
	if v := e.view(c, k); !v.Consistent() {
		t.Fatalf("after the recount: %+v", v)
	}
	if err := e.mc.Delete(FenceKey(k)); err != nil {
		t.Fatal(err)
	}
	var d DeltaFence
	process(t, c, &d, []rules.Op{positioned(k, 1, 22, inFlight)})
	e.wantExact(b, k, 22)
}

// TestOtherServersPosition: mysql.dsn points at a replica while the change
// stream reads the primary, whose binary log has the same base name. The
// replica recounts before a row reaches it; the row's event, from the
// primary's log, names a position that compares as before the replica's
// fence. Skipping it would leave the counter one short for good.
func TestOtherServersPosition(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:23")
	b.insert(23)
	wantOutcomes(t, apply(t, c, recountOp(k, "23")), cacheops.OutcomeRecounted)
	v := e.view(c, k)
	if !v.Consistent() {
		t.Fatalf("after the recount: %+v", v)
	}
	var ours uint32
	if err := b.db.QueryRow("SELECT @@server_id").Scan(&ours); err != nil {
		t.Fatal(err)
	}
	b.insert(23) // replicated now: the replica holds the row
	primary := rules.Position{BinlogFile: v.Fence.At.File, BinlogPos: 4, ServerID: ours + 1000}
	var d DeltaFence
	process(t, c, &d, []rules.Op{positioned(k, 1, 23, primary)})
	e.wantExact(b, k, 23)
}

// TestGTIDOnlyEventsAreFenced: events that carry only a GTID (MariaDB's
// "domain-server-seq") are fenced by the GTID position BINLOG_GTID_POS
// gives for the snapshot's binary log position.
func TestGTIDOnlyEventsAreFenced(t *testing.T) {
	b := newBinlogDB(t)
	e := newEnv(t)
	c := New(e.mc, b.m, Config{}, nil)
	k := e.key("comments:24")
	first := b.insertGTID(24)
	var d DeltaFence
	process(t, c, &d, []rules.Op{positioned(k, 1, 24, first)})
	e.wantExact(b, k, 24)
	v := e.view(c, k)
	if !v.Consistent() || v.Fence.GTID == "" {
		t.Fatalf("after the miss: %+v, want a fence with the snapshot's GTID position", v)
	}
	second := b.insertGTID(24)
	// first is delivered again (a rebalance): the recount holds it.
	process(t, c, &d, []rules.Op{positioned(k, 1, 24, first), positioned(k, 1, 24, second)})
	if d.Stats.Skipped != 1 || d.Stats.Unfenced != 0 {
		t.Fatalf("stats = %+v, want the first delta skipped by its GTID", d.Stats)
	}
	e.wantExact(b, k, 24)
}

func TestFencingRequired(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b := newBinlogDB(t)
	if err := New(e.mc, b.m, Config{Fencing: FencingRequired}, nil).CheckFencing(ctx); err != nil {
		t.Fatalf("CheckFencing with the binary log on: %v", err)
	}
	m, db, _ := newCommentsDB(t)
	var on int
	if err := db.QueryRow("SELECT @@log_bin").Scan(&on); err != nil {
		t.Fatal(err)
	}
	if on == 1 {
		t.Skip("the server at CACHEWARDEN_TEST_MYSQL_DSN has its binary log on; the rest needs one without")
	}
	err := New(e.mc, m, Config{Fencing: FencingRequired}, nil).CheckFencing(ctx)
	if !errors.Is(err, ErrCannotFence) || !strings.Contains(err.Error(), "log_bin = OFF") {
		t.Fatalf("CheckFencing without the binary log = %v, want ErrCannotFence naming log_bin", err)
	}
	if err := New(e.mc, m, Config{}, nil).CheckFencing(ctx); err != nil {
		t.Fatalf("CheckFencing in auto mode = %v, want nil", err)
	}
	c := New(e.mc, m, Config{Fencing: FencingOff}, nil)
	wantOutcomes(t, apply(t, c, recountOp(e.key("comments:25"), "25")), cacheops.OutcomeRecounted)
	if by := c.Stats().UnfencedBy; by["disabled"] != 1 {
		t.Fatalf("unfenced by reason = %v, want one disabled", by)
	}
}
