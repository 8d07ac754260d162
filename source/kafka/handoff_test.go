package kafka

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// commentFeed inserts comments into MySQL and publishes their Debezium
// events, keyed by post, in the order of the inserts.
type commentFeed struct {
	t       *testing.T
	db      *sql.DB
	brokers []string
	topic   string
	posts   int
	nextID  atomic.Int64
}

func (f *commentFeed) add(n int) {
	f.t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		id := f.nextID.Add(1)
		post := int(id) % f.posts
		if _, err := f.db.Exec("INSERT INTO comments (id, post_id) VALUES (?, ?)", id, post); err != nil {
			f.t.Error(err)
			return
		}
		msgs[i] = debezium("c", "blog", "comments", nil, row("id", id, "post_id", post))
		msgs[i].Key = []byte(strconv.Itoa(post))
	}
	produce(f.t, f.brokers, f.topic, msgs...)
}

// TestGracefulHandoffsRecountNothing moves partitions between three
// daemons under load, each handoff graceful (members join and leave):
// no counter delta is turned into a recount, every counter stays equal
// to COUNT(*), and each released partition is committed as handed off.
func TestGracefulHandoffsRecountNothing(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	createComments(t, db, 0, 0)
	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
	topic := "cdc-handoff-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 6, topic)
	feed := &commentFeed{t: t, db: db, brokers: brokers, topic: topic, posts: 12}

	// Before the measured window: the first owner, finding no commit,
	// recounts every counter its first batches touch.
	feed.add(240)
	dA, stopA := r.daemon(brokers, group, topic)
	waitCounters(t, r, db, feed.posts)
	base := testsvc.Metric(t, r.reg, "cachewarden_recounts_total", "reason=reassigned")

	// The measured window: a steady feed while members come and go.
	ctx, cancel := context.WithCancel(context.Background())
	var feeding sync.WaitGroup
	feeding.Go(func() {
		for ctx.Err() == nil {
			feed.add(10)
			time.Sleep(20 * time.Millisecond)
		}
	})
	// Each step waits until the group has settled (every member owns
	// partitions, all 6 owned), however long a loaded machine takes, then
	// lets the members consume a while before the next.
	live := map[string]*Daemon{"A": dA}
	step := func(what string, f func()) {
		t.Logf("%s", what)
		f()
		waitFor(t, 60*time.Second, func() string {
			owned := 0
			for name, d := range live {
				n := len(d.ownedPartitions())
				if n == 0 {
					return what + ": " + name + " owns no partition"
				}
				owned += n
			}
			if owned != 6 {
				return fmt.Sprintf("%s: %d of the 6 partitions owned", what, owned)
			}
			return ""
		})
		time.Sleep(500 * time.Millisecond)
	}
	var stopB, stopC func() error
	join := func(name string, stop *func() error) func() {
		return func() { live[name], *stop = r.daemon(brokers, group, topic) }
	}
	leave := func(name string, stop func() error) func() {
		return func() { delete(live, name); must(t, stop()) }
	}
	step("B joins", join("B", &stopB))
	step("C joins", join("C", &stopC))
	step("A leaves", leave("A", stopA))
	step("A joins again", join("A", &stopA))
	step("B leaves", leave("B", stopB))
	step("C leaves", leave("C", stopC))
	cancel()
	feeding.Wait()
	waitCounters(t, r, db, feed.posts)
	must(t, stopA())

	if got := testsvc.Metric(t, r.reg, "cachewarden_recounts_total", "reason=reassigned") - base; got != 0 {
		t.Errorf("%v counter deltas turned into recounts by graceful handoffs, want 0", got)
	}
	if got := metricValue(r.metrics.handoffs.WithLabelValues("clean")); got < 6 {
		t.Errorf("clean handoffs = %v, want at least 6", got)
	}
	if got := metricValue(r.metrics.handoffs.WithLabelValues("abandoned")); got != 0 {
		t.Errorf("abandoned handoffs = %v, want 0", got)
	}
	t.Logf("%d comments on %d posts; clean handoffs %v; recounts in the window %v",
		feed.nextID.Load(), feed.posts, metricValue(r.metrics.handoffs.WithLabelValues("clean")),
		testsvc.Metric(t, r.reg, "cachewarden_recounts_total", "reason=reassigned")-base)
}

// waitCounters waits until every post's counter equals its COUNT(*).
func waitCounters(t *testing.T, r *rig, db *sql.DB, posts int) {
	t.Helper()
	waitFor(t, 60*time.Second, func() string {
		for p := range posts {
			var n int
			if err := db.QueryRow("SELECT COUNT(*) FROM comments WHERE post_id = ?", p).Scan(&n); err != nil {
				return err.Error()
			}
			if got := r.get("comments:" + strconv.Itoa(p)); got != strconv.Itoa(n) {
				return fmt.Sprintf("comments:%d = %q, COUNT(*) = %d", p, got, n)
			}
		}
		return ""
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestHandoffMarkerReplaced checks that the owner after a clean handoff
// commits the handoff's offset again as cachewarden:consuming before it
// commits anything past it: the marker says nothing past the offset was
// applied, which is no longer true once that owner applied its first
// batch, and an owner after it that found the marker still there (this
// one crashed, or stalled past its session, before its own first commit)
// would apply the same counter deltas again. The in-process broker
// records every commit.
func TestHandoffMarkerReplaced(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	createComments(t, db, 0, 0)
	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
	topic := "cdc-marker-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var mu sync.Mutex
	var commits []string
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		for _, rt := range req.(*kmsg.OffsetCommitRequest).Topics {
			for _, p := range rt.Partitions {
				meta := ""
				if p.Metadata != nil {
					meta = *p.Metadata
				}
				commits = append(commits, fmt.Sprintf("%d %s", p.Offset, meta))
			}
		}
		return nil, nil, false
	})
	committed := func(want string) func() string {
		return func() string {
			mu.Lock()
			defer mu.Unlock()
			if slices.Contains(commits, want) {
				return ""
			}
			return fmt.Sprintf("no commit %q among %v", want, commits)
		}
	}
	brokers := c.ListenAddrs()
	feed := &commentFeed{t: t, db: db, brokers: brokers, topic: topic, posts: 3}

	feed.add(5)
	_, stopA := r.daemon(brokers, group, topic)
	waitFor(t, 30*time.Second, committed("5 "+commitConsuming))
	must(t, stopA())
	waitFor(t, 5*time.Second, committed("5 "+commitHandedOff))

	feed.add(3)
	_, stopB := r.daemon(brokers, group, topic)
	waitFor(t, 30*time.Second, committed("8 "+commitConsuming))
	must(t, stopB())
	waitCounters(t, r, db, feed.posts)

	mu.Lock()
	defer mu.Unlock()
	i := slices.Index(commits, "5 "+commitHandedOff)
	if i < 0 || i+1 >= len(commits) || commits[i+1] != "5 "+commitConsuming {
		t.Fatalf("commits %v: want the handoff at 5 followed by 5 %s", commits, commitConsuming)
	}
}
