package observer

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/rules"
)

// Counters judged at a binary log position.
//
// A recount reads MySQL as it is now, while the daemon has applied the
// changes up to some point of the binary log only: comparing the two
// blames the cache for the lag of the CDC connector, Kafka and the
// daemon. With a Truth that counts in a consistent snapshot and names
// the snapshot's binary log position P (counters.SnapshotCounter, the
// recount API of exact counters), a counter is judged only where its
// state is known to be "every change up to P, none after":
//
//  1. the counter is read (value and cas token);
//  2. the recount runs in a snapshot at P, which starts after that read,
//     so every change the read saw applied was committed before P;
//  3. once the daemon has applied, on every partition of the change's
//     topic, a change at or after P (so every change up to P: events of
//     one partition are applied in order), the counter is read again: if
//     its cas token is unchanged, the first reading holds exactly the
//     changes up to P and must equal the recount.
//
// The partitions of a topic are learnt with SetPartitionCounts (the
// daemon's pipeline passes on what it learns at each assignment); a
// partition of the topic this daemon has never applied a change from
// (another instance applies it) keeps its counters unjudged. Until the
// daemon reaches P the check waits, looking again every ConfirmAfter/20
// for at most ConfirmAfter (the sooner the second read, the less likely
// a change moved the counter); if it has not reached P by then, or the
// counter moved meanwhile, or the positions cannot be compared (another server's log), the counter is
// not judged. Where the recount has no position (binary log off, MySQL
// 8), the change carries none, or the observer is detached (it does not
// know what the writing daemon has applied), the confirm step judges
// instead (see checkData).

// appliedPos is the last change the daemon applied on one partition.
type appliedPos struct {
	at     counters.BinlogPosition
	server uint32
}

// partitionKey names a partition of a topic.
type partitionKey struct {
	topic     string
	partition int
}

// appliedPositions records, per topic and partition, the binary log
// position of the last change applied, and how many partitions each
// topic has. Safe for concurrent use.
type appliedPositions struct {
	mu     sync.Mutex
	m      map[string]map[int]appliedPos
	counts map[string]int
}

// batchPosition is the latest binary log position of a batch's ops on
// one partition.
type batchPosition struct {
	key partitionKey
	appliedPos
}

// batchPositions returns the latest binary log position of ops per
// partition (ops without one are left out). A batch holds few
// partitions: they are searched in a slice, the last one first.
func batchPositions(ops []rules.Op) []batchPosition {
	var out []batchPosition
	last := -1
	for i := range ops {
		s := &ops[i].Source
		if s.BinlogFile == "" {
			continue
		}
		if last < 0 || out[last].key.partition != s.Partition || out[last].key.topic != s.Topic {
			last = -1
			for j := range out {
				if out[j].key.partition == s.Partition && out[j].key.topic == s.Topic {
					last = j
					break
				}
			}
			if last < 0 {
				out = append(out, batchPosition{key: partitionKey{s.Topic, s.Partition}})
				last = len(out) - 1
			}
		}
		e := &out[last]
		at := counters.PositionOf(*s)
		if e.at.Known() {
			if order, ok := counters.ComparePositions(e.at, at); ok && order >= 0 {
				continue
			}
		}
		e.at, e.server = at, s.ServerID
	}
	for i := range out {
		out[i].key.topic = strings.Clone(out[i].key.topic)
		out[i].at.File = strings.Clone(out[i].at.File)
	}
	return out
}

// advance records a batch's positions once it has been applied.
func (a *appliedPositions) advance(batch []batchPosition) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = make(map[string]map[int]appliedPos)
	}
	for _, b := range batch {
		k, p := b.key, b.appliedPos
		parts := a.m[k.topic]
		if parts == nil {
			parts = make(map[int]appliedPos)
			a.m[k.topic] = parts
		}
		if prev, ok := parts[k.partition]; ok {
			// Positions only move forward (a batch of delayed ops may
			// carry older ones).
			if order, ok := counters.ComparePositions(prev.at, p.at); ok && order > 0 {
				continue
			}
		}
		parts[k.partition] = p
	}
}

// setCounts records how many partitions each topic has.
func (a *appliedPositions) setCounts(counts map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.counts = make(map[string]int, len(counts))
	for t, n := range counts {
		a.counts[t] = n
	}
}

// reached reports whether the daemon has applied, on every partition of
// topic, a change at or after at (of server; 0 when unknown); else why
// not. A partition it applied a change at or after at from and then
// handed to another daemon instance still counts: the changes up to at on
// it were applied.
func (a *appliedPositions) reached(topic string, at counters.BinlogPosition, server uint32) (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	parts := a.m[topic]
	n, known := a.counts[topic]
	switch {
	case !known:
		return false, "the number of partitions of topic " + topic + " is not known"
	case len(parts) < n:
		return false, fmt.Sprintf("the daemon has applied changes from %d of the %d partitions of topic %s", len(parts), n, topic)
	}
	ids := make([]int, 0, len(parts))
	for p := range parts {
		ids = append(ids, p)
	}
	sort.Ints(ids)
	for _, p := range ids {
		e := parts[p]
		if e.server != 0 && server != 0 && e.server != server {
			return false, fmt.Sprintf("partition %d applied changes of server %d, the recount ran on server %d", p, e.server, server)
		}
		order, ok := counters.ComparePositions(e.at, at)
		if !ok {
			return false, fmt.Sprintf("partition %d's position %s cannot be compared with the recount's %s", p, e.at, at)
		}
		if order < 0 {
			return false, fmt.Sprintf("the daemon has applied partition %d of %s up to %s, short of the recount's position %s: changes in between may still be on their way", p, topic, e.at, at)
		}
	}
	return true, ""
}

// SetPartitionCounts tells the observer how many partitions each topic
// has (topic -> count), replacing what it knew; a counter is judged at a
// position only once the daemon has applied changes from every partition
// of its change's topic. Safe for concurrent use.
func (o *Observer) SetPartitionCounts(counts map[string]int) { o.positions.setCounts(counts) }

// snapshotCounter returns the Truth's snapshot recount when c's counter
// can be judged at a position: the daemon's applied positions are known
// (the observer is not detached) and c's change carries a binary log
// position. Else nil.
func (o *Observer) snapshotCounter(c *change) counters.SnapshotCounter {
	if o.cfg.Detached || c.source.BinlogFile == "" {
		return nil
	}
	sc, _ := o.deps.Truth.(counters.SnapshotCounter)
	return sc
}

// atPosition is the first reading of a counter judged at a position.
type atPosition struct {
	count counters.SnapshotCount
	// until is when the wait for the daemon to reach the position ends.
	until time.Time
}

// positionPolls is how many times, at most, a check looks whether the
// daemon has reached a recount's position while it waits ConfirmAfter:
// the sooner it reads the counter again, the less likely a change moved
// it meanwhile.
const positionPolls = 20

// countAt recounts c's counter in a snapshot. handled is false when the
// snapshot has no position: r.count then holds the count for the confirm
// step.
func (o *Observer) countAt(ctx context.Context, t *task, r *reading, snap counters.SnapshotCounter) (v verdict, confirm *task, handled bool) {
	c := t.c
	sc, err := snap.CountInSnapshot(ctx, c.rule.Query, c.args, counters.SnapshotOptions{})
	if err != nil {
		return verdict{NotJudged, "", "query failed: " + err.Error()}, nil, true
	}
	if !sc.At.Known() {
		r.count = sc.N
		return verdict{}, nil, false
	}
	if c.source.ServerID != 0 && sc.ServerID != 0 && c.source.ServerID != sc.ServerID {
		return verdict{NotJudged, expectedAt(sc), r.item.text() + fmt.Sprintf(" (the change came from server %d, the recount ran on server %d)", c.source.ServerID, sc.ServerID)}, nil, true
	}
	if _, ok := counters.ComparePositions(counters.PositionOf(c.source), sc.At); !ok {
		return verdict{NotJudged, expectedAt(sc), r.item.text() + fmt.Sprintf(" (the change's position %s:%d and the recount's %s are of different logs)", c.source.BinlogFile, c.source.BinlogPos, sc.At)}, nil, true
	}
	r.at = &atPosition{count: sc, until: o.deps.Now().Add(o.cfg.ConfirmAfter)}
	v, confirm = o.judgeAt(t, r)
	return v, confirm, true
}

// judgeAt judges the counter first read in first once the daemon has
// reached the recount's position: it reads the counter again and
// compares the first reading with the recount when nothing moved it.
// Until then it returns the next look (every ConfirmAfter/positionPolls,
// until first.at.until), and after that the counter is not judged.
func (o *Observer) judgeAt(t *task, first *reading) (verdict, *task) {
	sc := first.at.count
	if ok, why := o.positions.reached(t.c.source.Topic, sc.At, sc.ServerID); !ok {
		now := o.deps.Now()
		if now.Before(first.at.until) {
			due := now.Add(o.cfg.ConfirmAfter / positionPolls)
			if due.After(first.at.until) {
				due = first.at.until
			}
			return verdict{}, &task{due: due, c: t.c, window: t.window, first: first}
		}
		return verdict{NotJudged, expectedAt(sc), first.item.text() + " (" + why + ")"}, nil
	}
	return o.compareAt(t, first), nil
}

// compareAt reads the counter again and compares the first reading with
// the recount when nothing moved the counter in between.
func (o *Observer) compareAt(t *task, first *reading) verdict {
	sc := first.at.count
	items, v, ok := o.read([]string{t.c.key})
	if !ok {
		return v
	}
	now := items[t.c.key]
	if !now.Present {
		return verdict{result: Missing}
	}
	if now.cas != first.item.cas {
		return verdict{NotJudged, expectedAt(sc), first.item.text() + ", then " + now.text() + " (the counter changed while the daemon caught up with the recount's position)"}
	}
	v = judgeCounter(first.item, sc.N)
	if v.result == Inconsistent {
		v.expected = expectedAt(sc)
	}
	return v
}

// expectedAt describes a recount at its position.
func expectedAt(sc counters.SnapshotCount) string {
	s := strconv.FormatInt(sc.N, 10) + " (recount at " + sc.At.String()
	if sc.ServerID != 0 {
		s += " of server " + strconv.FormatUint(uint64(sc.ServerID), 10)
	}
	return s + ")"
}
