package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/integration"
)

// The commit-to-namespace measurement, shared by the Kafka path
// (BenchmarkReplicaReaders) and the binary log source
// (BenchmarkBinlogSource): writers on e2eConns connections change rows of
// table samples at a fixed rate, and a sampler polls memcached for the
// namespace of one changed row in e2eSampleEvery until it moves.

// e2eConns is how many connections the measurement writes on.
const e2eConns = 16

// e2eSampleEvery: one change in this many is a sample.
const e2eSampleEvery = 20

// e2eSamplesTable is the table the measurement changes:
// samples (id INT PRIMARY KEY AUTO_INCREMENT, v INT NOT NULL).
const e2eSamplesTable = "samples"

// e2eSource is a daemon under the commit-to-namespace measurement: the
// primary whose changes it follows, the memcached it writes and how the
// changes reach it.
type e2eSource struct {
	b  *testing.B
	db *sql.DB // the primary, holding e2eSamplesTable
	mc *memcache.Client
	// key is the namespace key the daemon bumps for row id of samples.
	key func(id int) string
	// committed, when set, is called on the writer's connection right
	// after each transaction the measurement commits: the Kafka path
	// queues the transaction's Debezium events there. nil when the
	// daemon reads the changes from the server itself (the binary log).
	committed func(ctx context.Context, conn *sql.Conn, table string, at time.Time, rows ...rowChange)
	// caughtUp waits until the daemon has applied every change so far.
	caughtUp func(ctx context.Context)
}

// rowChange is a row's id and its v after the change (v - 1 before).
type rowChange struct{ id, v int }

// changeRows adds one to v of rows (distinct ids, whose new v the caller
// knows) in one transaction, one UPDATE, and hands them to s.committed.
// It returns the commit time.
func (s *e2eSource) changeRows(ctx context.Context, conn *sql.Conn, table string, rows []rowChange) time.Time {
	args := make([]any, len(rows))
	for i, r := range rows {
		args[i] = r.id
	}
	marks := strings.Repeat(",?", len(rows))[1:]
	res, err := conn.ExecContext(ctx, "UPDATE "+table+" SET v = v + 1 WHERE id IN ("+marks+")", args...)
	if err != nil {
		s.b.Fatal(err)
	}
	committed := time.Now()
	if n, _ := res.RowsAffected(); n != int64(len(rows)) {
		s.b.Fatalf("UPDATE of %d rows changed %d", len(rows), n)
	}
	if s.committed != nil {
		s.committed(ctx, conn, table, committed, rows...)
	}
	return committed
}

// e2eRows are the rows one measurement changes: samples (each changed
// once, never changed before) and each connection's filler rows.
type e2eRows struct {
	samples []int
	base    int // first filler row
	perTx   int
}

// filler is connection conn's j-th filler row.
func (r e2eRows) filler(conn, j int) int { return r.base + conn*r.perTx + j }

// insertRows inserts the rows of n changes, perTx per transaction, and
// waits until the daemon has applied the inserts.
func (s *e2eSource) insertRows(ctx context.Context, n, perTx int) e2eRows {
	var base int
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(id), 0) + 1 FROM "+e2eSamplesTable).Scan(&base); err != nil {
		s.b.Fatal(err)
	}
	r := e2eRows{samples: make([]int, (n+e2eSampleEvery-1)/e2eSampleEvery), perTx: perTx}
	for i := range r.samples {
		r.samples[i] = base + i
	}
	r.base = base + len(r.samples)
	rows := len(r.samples) + e2eConns*perTx
	for at := 0; at < rows; at += 1000 {
		k := min(1000, rows-at)
		args := make([]any, k)
		for i := range args {
			args[i] = base + at + i
		}
		if _, err := s.db.ExecContext(ctx, "INSERT INTO "+e2eSamplesTable+" (id, v) VALUES "+strings.Repeat(",(?, 0)", k)[1:], args...); err != nil {
			s.b.Fatal(err)
		}
	}
	s.caughtUp(ctx)
	return r
}

// write makes n changes of rows at rate changes/s from e2eConns
// connections, perTx rows per transaction (one UPDATE; each row its own
// event and its own bump): change i is sample i/e2eSampleEvery when i is
// a multiple of e2eSampleEvery, else the writing connection's filler row
// at its place in the transaction (no lock waits between connections).
// It calls sampled with each sample's commit time and returns how long
// the writing took.
func (s *e2eSource) write(ctx context.Context, rows e2eRows, rate, n int, sampled func(id int, at time.Time)) time.Duration {
	perTx := rows.perTx
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range e2eConns {
		wg.Go(func() {
			conn, err := s.db.Conn(ctx)
			if err != nil {
				s.b.Error(err)
				return
			}
			defer conn.Close()
			fillerV := make([]int, perTx)
			tx := make([]rowChange, 0, perTx)
			var samples []int
			for {
				first := int(next.Add(int64(perTx))) - perTx
				if first >= n {
					return
				}
				if d := time.Until(start.Add(time.Duration(first) * time.Second / time.Duration(rate))); d > 0 {
					time.Sleep(d)
				}
				tx, samples = tx[:0], samples[:0]
				for i := first; i < min(first+perTx, n); i++ {
					if i%e2eSampleEvery == 0 {
						samples = append(samples, rows.samples[i/e2eSampleEvery])
						tx = append(tx, rowChange{rows.samples[i/e2eSampleEvery], 1})
						continue
					}
					j := i - first
					fillerV[j]++
					tx = append(tx, rowChange{rows.filler(w, j), fillerV[j]})
				}
				at := s.changeRows(ctx, conn, e2eSamplesTable, tx)
				for _, id := range samples {
					sampled(id, at)
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// e2eResult is one commit-to-namespace measurement.
type e2eResult struct {
	rate, perTx   int
	achieved      float64 // changes/s
	samples, of   int     // samples whose namespace moved, of all
	lat           []time.Duration
	p50, p99, max time.Duration
}

// row is the result as a row of the table e2eHeader starts.
func (r e2eResult) row() string {
	return fmt.Sprintf("| %d | %.0f | %d of %d | %s | %s |", r.rate, r.achieved, r.samples, r.of, fmtDur(r.p50), fmtDur(r.p99))
}

// e2eHeader is the header of the table of e2eResult rows.
const e2eHeader = "| offered changes/s | achieved | samples | commit to namespace moved p50 | p99 |\n|---|---|---|---|---|"

// endToEnd changes rows at rate for 10s, perTx rows per transaction (see
// write), and measures, for one change in e2eSampleEvery (a row of its
// own, changed once), the time from its commit to its namespace moving in
// memcached: present with a value other than before the change.
func (s *e2eSource) endToEnd(ctx context.Context, rate, perTx int) e2eResult {
	n := rate * 10
	rows := s.insertRows(ctx, n, perTx)
	before := s.namespaces(rows.samples)
	var mu sync.Mutex
	committed := map[int]time.Time{}
	// The sampler: polls the samples' namespaces every 2ms, until every
	// sample moved or a minute after the writers finished.
	seen := map[int]time.Duration{}
	samplerDone := make(chan struct{})
	var writersDone atomic.Int64 // Unix ns; 0: still writing
	go func() {
		defer close(samplerDone)
		for len(seen) < len(rows.samples) {
			if done := writersDone.Load(); done != 0 && time.Since(time.Unix(0, done)) > time.Minute {
				break
			}
			mu.Lock()
			var keys []string
			byKey := map[string]int{}
			for id := range committed {
				if _, ok := seen[id]; !ok {
					k := s.key(id)
					keys = append(keys, k)
					byKey[k] = id
				}
			}
			mu.Unlock()
			if len(keys) > 0 {
				items, err := s.mc.GetMulti(keys)
				if err == nil {
					now := time.Now()
					mu.Lock()
					for k, it := range items {
						if old, ok := before[k]; ok && old == string(it.Value) {
							continue
						}
						id := byKey[k]
						seen[id] = now.Sub(committed[id])
					}
					mu.Unlock()
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	elapsed := s.write(ctx, rows, rate, n, func(id int, at time.Time) {
		mu.Lock()
		committed[id] = at
		mu.Unlock()
	})
	writersDone.Store(time.Now().UnixNano())
	<-samplerDone
	res := e2eResult{rate: rate, perTx: perTx, achieved: float64(n) / elapsed.Seconds(), samples: len(seen), of: len(rows.samples)}
	for _, d := range seen {
		res.lat = append(res.lat, d)
	}
	slices.Sort(res.lat)
	res.p50, res.p99 = Percentile(res.lat, 0.5), Percentile(res.lat, 0.99)
	if len(res.lat) > 0 {
		res.max = res.lat[len(res.lat)-1]
	}
	return res
}

// namespaces returns the values of the samples' namespaces in memcached
// now (absent ones left out).
func (s *e2eSource) namespaces(ids []int) map[string]string {
	out := map[string]string{}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 500)]
		ids = ids[len(chunk):]
		keys := make([]string, len(chunk))
		for i, id := range chunk {
			keys[i] = s.key(id)
		}
		items, err := s.mc.GetMulti(keys)
		if err != nil {
			s.b.Fatal(err)
		}
		for k, it := range items {
			out[k] = string(it.Value)
		}
	}
	return out
}

// eventQueue publishes the Debezium events of committed changes to one
// topic, in the order they were queued, in batches; what a Debezium
// connector does for the Kafka path. Safe for concurrent use.
type eventQueue struct {
	b        *testing.B
	pub      *integration.Publisher
	topic    string
	db       string // source.db of the events
	serverID uint32 // source.server_id of the events
	mu       sync.Mutex
	unsent   []integration.OutMessage
	cond     *sync.Cond
	queued   atomic.Int64 // events queued so far
}

func newEventQueue(b *testing.B, pub *integration.Publisher, topic, db string, serverID uint32) *eventQueue {
	q := &eventQueue{b: b, pub: pub, topic: topic, db: db, serverID: serverID}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// start publishes queued events until stop is called.
func (q *eventQueue) start(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			q.mu.Lock()
			for len(q.unsent) == 0 {
				select {
				case <-done:
					q.mu.Unlock()
					return
				default:
				}
				q.cond.Wait()
			}
			batch := q.unsent
			q.unsent = nil
			q.mu.Unlock()
			if err := q.pub.PublishRaw(ctx, batch...); err != nil {
				q.b.Error(err)
				return
			}
		}
	})
	return func() {
		close(done)
		q.mu.Lock()
		q.cond.Broadcast()
		q.mu.Unlock()
		wg.Wait()
	}
}

// queue reads the GTID of conn's last transaction, which changed rows of
// table at committed, and queues one update event per row with the source
// block (server_id, gtid) the connector would write.
func (q *eventQueue) queue(ctx context.Context, conn *sql.Conn, table string, committed time.Time, rows ...rowChange) {
	var gtid string
	if err := conn.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&gtid); err != nil {
		q.b.Fatal(err)
	}
	msgs := make([]integration.OutMessage, len(rows))
	for i, r := range rows {
		row := func(v int) map[string]any { return map[string]any{"id": r.id, "v": v} }
		ev, err := json.Marshal(map[string]any{
			"op": "u", "before": row(r.v - 1), "after": row(r.v), "ts_ms": committed.UnixMilli(),
			"source": map[string]any{"connector": "mysql", "db": q.db, "table": table, "server_id": q.serverID,
				"gtid": gtid, "ts_ms": committed.UnixMilli()},
		})
		if err != nil {
			q.b.Fatal(err)
		}
		msgs[i] = integration.OutMessage{Topic: q.topic, Key: []byte(table + strconv.Itoa(r.id)), Value: ev}
	}
	q.mu.Lock()
	q.unsent = append(q.unsent, msgs...)
	q.cond.Signal()
	q.mu.Unlock()
	q.queued.Add(int64(len(rows)))
}

// published waits until every queued event has been handed to the
// broker.
func (q *eventQueue) published() {
	for {
		q.mu.Lock()
		empty := len(q.unsent) == 0
		q.mu.Unlock()
		if empty {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the last PublishRaw
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "—"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}
